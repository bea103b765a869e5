//! A SQLite VFS that writes each transaction's write-ahead-log frames in a few system calls.
//!
//! SQLite writes a WAL frame as two `pwrite`s (its 24-byte header, then the page), so a
//! transaction that changes 60 pages costs 120 system calls, each walking the kernel's write
//! path for a few bytes or one page. On the machines the gateway is measured on that was a
//! sixth of the ledger writer's CPU under load. This VFS is the platform's own (`unix` on
//! Linux) with one change: the writes to a `-wal` file that follow each other are gathered in
//! memory and handed to the platform's file in writes of at most 16 KiB (three frames of 4 KiB
//! pages), before anything that could need them on disk or read them back: a sync, a read, a
//! truncation, a size query, a file-control call, a mapping, a write elsewhere in the file, or
//! the file's close. Every other file (the database, its shared-memory index, journals) is the
//! platform's, untouched.
//!
//! Durability is SQLite's: with `PRAGMA synchronous = FULL`, a WAL commit syncs the log
//! before it publishes the commit in the shared-memory index, so the gathered frames are
//! written and synced before any reader, in this process or another, can look for them, and
//! before the commit returns. **Only** `synchronous = FULL` (or `EXTRA`) may be used through
//! this VFS: with `NORMAL` or `OFF` a commit publishes its frames without a sync, and a reader
//! could look for frames still gathered here. A failed write surfaces at the sync (or read)
//! that wrote it as an I/O error, which makes SQLite roll the whole transaction back; the
//! frames it had not published are written again by the next transaction.
//!
//! One connection only may write a database's log through it, and no other connection may
//! write that log at all (the ledger's writer is its file's only writer): bytes gathered by a
//! transaction that spilled pages and then rolled back are written later, with the
//! connection's next write, and would land on frames another writer committed meanwhile.
//! A database without power-safe overwrite (`psow=0`) has its log left ungathered (see
//! `power_safe`).
//!
//! Connections choose it by name ([`NAME`], after [`register`]); it is never the default.

use std::ffi::{CStr, c_int, c_void};
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

use rusqlite::ffi;

/// The VFS's name, for `sqlite3_open_v2` (`rusqlite::Connection::open_with_flags_and_vfs`).
pub const NAME: &str = "toolgate-gathered-wal";
const NAME_C: &CStr = c"toolgate-gathered-wal";

/// The most bytes gathered before they are written (three frames of 4 KiB pages): a commit
/// of 60 pages is 20 writes, not 120. Writing 60 frames took 225 µs as two writes a frame,
/// about 85 µs in 12 KiB writes and 63 µs in 128 KiB ones. Larger writes would save little
/// more and cost bytes on disk: Linux caches a large write in folios as large as the write
/// (up to the filesystem's limit; ext4 has them since 6.16), and a later commit that starts
/// inside one makes the whole folio dirty again, so every commit rewrote up to a whole folio
/// of the one before. Measured with writes of up to 128 KiB: 80% more bytes written per call at 1,000
/// calls/s than two writes a frame, and 16% more saturated. (The `unix` VFS writes at most
/// 128 KiB - 1 bytes in one call in any case: it masks a larger count.)
const GATHER_LIMIT: usize = 16 * 1024;

/// Where the platform's file lies in the memory SQLite gives [`open`]: right after ours.
const REAL_OFFSET: usize = std::mem::size_of::<WalFile>();

/// The platform's VFS, which this one wraps (set once, by [`register`]).
static BASE: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

/// Why [`register`] failed: SQLite's result code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterError(pub c_int);

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "could not register the SQLite VFS {NAME}: SQLite error {}",
            self.0
        )
    }
}

impl std::error::Error for RegisterError {}

/// Registers the VFS with SQLite, once per process (later calls answer as the first did).
/// It wraps the default VFS as it stands at the first call, and does not become the default.
pub fn register() -> Result<(), RegisterError> {
    static REGISTERED: OnceLock<Result<(), RegisterError>> = OnceLock::new();
    *REGISTERED.get_or_init(register_now)
}

fn register_now() -> Result<(), RegisterError> {
    // SAFETY: with a null name, `sqlite3_vfs_find` initializes SQLite if it has to and
    // returns the default VFS, or null. A registered VFS stays valid while it is registered,
    // and nothing in this process unregisters the platform's.
    let base = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
    if base.is_null() {
        return Err(RegisterError(ffi::SQLITE_ERROR));
    }
    // SAFETY: `base` is a registered VFS (above), valid to read.
    let platform = unsafe { *base };
    let Some(size) = usize::try_from(platform.szOsFile)
        .ok()
        .and_then(|size| c_int::try_from(REAL_OFFSET + size).ok())
    else {
        return Err(RegisterError(ffi::SQLITE_ERROR));
    };
    BASE.store(base, Ordering::Release);
    // The platform's other methods are shared as they are, with its own `pAppData`: SQLite's
    // platform VFSes already share them among their variants (`unix`, `unix-excl`,
    // `unix-dotfile`, ...), which differ in their name and `pAppData` only, and they take the
    // VFS as a context they do not use. Only `xOpen` (which reads `pAppData` to choose a
    // locking style) is wrapped, and it calls the platform's with the platform's VFS.
    let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
        // Version 3 at most: the fields this code knows.
        iVersion: platform.iVersion.min(3),
        szOsFile: size,
        pNext: ptr::null_mut(),
        zName: NAME_C.as_ptr(),
        xOpen: Some(open),
        ..platform
    }));
    // SAFETY: `vfs` is leaked, so it lives as long as the process, as a registered VFS must;
    // its name is a static C string; 0 registers it without making it the default.
    let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(RegisterError(rc))
    }
}

/// An open `-wal` file: SQLite's file object (its methods are [`WAL_METHODS`]), the
/// platform's file (in the same allocation, at [`REAL_OFFSET`]), and the writes gathered for
/// it.
#[repr(C)]
struct WalFile {
    /// First, as SQLite reads its methods from the start of the object.
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    /// Bytes written to the file that follow each other, not yet handed to `real`.
    gathered: Vec<u8>,
    /// Where `gathered` starts in the file.
    at: i64,
}

/// Opens a file: a `-wal` file as a [`WalFile`], anything else as the platform opens it.
unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let base = BASE.load(Ordering::Acquire);
    // SAFETY: `BASE` is set before this VFS is registered, so before SQLite can call this; it
    // is the platform's registered VFS.
    let Some(platform_open) = (unsafe { (*base).xOpen }) else {
        return ffi::SQLITE_CANTOPEN;
    };
    // SAFETY: `name` is the filename SQLite hands `xOpen`, which `sqlite3_uri_boolean`
    // accepts for a `-wal` file (it finds the database's URI parameters from it).
    if flags & ffi::SQLITE_OPEN_WAL == 0 || !unsafe { power_safe(name) } {
        // SAFETY: SQLite gave `file` this VFS's `szOsFile` bytes, more than the platform's
        // own; the other arguments are SQLite's, handed on.
        return unsafe { platform_open(base, name, file, flags, out_flags) };
    }
    // SAFETY: the allocation is `REAL_OFFSET` plus the platform's `szOsFile` bytes long
    // (`register_now`), so the platform's file fits after ours; SQLite aligns it to 8 bytes,
    // and `REAL_OFFSET` (the size of `WalFile`, whose alignment is 8) keeps that alignment.
    let real = unsafe { file.cast::<u8>().add(REAL_OFFSET) }.cast::<ffi::sqlite3_file>();
    // SAFETY: as for any other file, with `real` as the platform's file object.
    let rc = unsafe { platform_open(base, name, real, flags, out_flags) };
    if rc != ffi::SQLITE_OK {
        // SAFETY: `file` is SQLite's to write; a null method table tells SQLite that no file
        // was opened, so it will not call `xClose`. A platform file that set its methods
        // despite failing is closed here.
        unsafe {
            close_real(real);
            (*file).pMethods = ptr::null();
        }
        return rc;
    }
    let wal = WalFile {
        base: ffi::sqlite3_file {
            pMethods: &WAL_METHODS,
        },
        real,
        gathered: Vec::new(),
        at: 0,
    };
    // SAFETY: the allocation starts with room for a `WalFile`, aligned (above); it holds no
    // value yet, so nothing is overwritten that would need dropping. `wal_close` drops it.
    unsafe { file.cast::<WalFile>().write(wal) };
    ffi::SQLITE_OK
}

/// Whether the database of the `-wal` file `name` has power-safe overwrite, as the `unix`
/// VFS decides it: its `psow` URI parameter, by default the build's `SQLITE_POWERSAFE_OVERWRITE`
/// (1 unless built with 0). Without it SQLite pads a commit to a sector boundary and writes
/// the rest of its last padding frame *after* the sync, then publishes the commit: bytes
/// gathered then would be published before they are in the file. Such a log is not gathered.
///
/// # Safety
/// `name` is a filename SQLite gave `xOpen` (or null).
unsafe fn power_safe(name: ffi::sqlite3_filename) -> bool {
    // SAFETY: a static C string; the answer is fixed for the linked SQLite.
    let built_off =
        unsafe { ffi::sqlite3_compileoption_used(c"POWERSAFE_OVERWRITE=0".as_ptr()) } != 0;
    // SAFETY: the caller's contract; SQLite's own `unixOpen` asks the same of its filenames.
    unsafe { ffi::sqlite3_uri_boolean(name, c"psow".as_ptr(), c_int::from(!built_off)) != 0 }
}

/// Closes a platform file that has methods (SQLite's contract: a file whose `pMethods` is set
/// must be closed, even if its open failed).
///
/// # Safety
/// `real` points to a platform file object, opened or not.
unsafe fn close_real(real: *mut ffi::sqlite3_file) {
    // SAFETY: the caller's contract.
    let methods = unsafe { (*real).pMethods };
    if !methods.is_null() {
        // SAFETY: a non-null method table is the platform's, static.
        if let Some(close) = unsafe { (*methods).xClose } {
            // SAFETY: `real` is an opened platform file, closed once.
            unsafe { close(real) };
        }
    }
}

/// The methods of a `-wal` file: the platform's, after the gathered writes are written, but
/// for `xWrite`, which gathers.
static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(wal_close),
    xRead: Some(wal_read),
    xWrite: Some(wal_write),
    xTruncate: Some(wal_truncate),
    xSync: Some(wal_sync),
    xFileSize: Some(wal_file_size),
    xLock: Some(wal_lock),
    xUnlock: Some(wal_unlock),
    xCheckReservedLock: Some(wal_check_reserved_lock),
    xFileControl: Some(wal_file_control),
    xSectorSize: Some(wal_sector_size),
    xDeviceCharacteristics: Some(wal_device_characteristics),
    xShmMap: Some(wal_shm_map),
    xShmLock: Some(wal_shm_lock),
    xShmBarrier: Some(wal_shm_barrier),
    xShmUnmap: Some(wal_shm_unmap),
    xFetch: Some(wal_fetch),
    xUnfetch: Some(wal_unfetch),
};

/// The [`WalFile`] SQLite calls a method of.
///
/// # Safety
/// `file` is a file [`open`] opened as a `-wal` file and has not closed; SQLite calls one
/// method of a file at a time (a connection is used by one thread at a time).
unsafe fn wal<'a>(file: *mut ffi::sqlite3_file) -> &'a mut WalFile {
    // SAFETY: the caller's contract: `open` wrote a `WalFile` there.
    unsafe { &mut *file.cast::<WalFile>() }
}

/// The platform's methods for `real`.
///
/// # Safety
/// `real` is an opened platform file.
unsafe fn methods<'a>(real: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    // SAFETY: an opened file's method table is set and static.
    unsafe { &*(*real).pMethods }
}

impl WalFile {
    /// Hands the gathered bytes to the platform's file, in one write. They are dropped whether
    /// it succeeds or not. A failure is answered as `SQLITE_IOERR_WRITE` whatever the
    /// platform said (a full disk included): SQLite had been told those writes succeeded, and
    /// only an I/O error makes it roll the whole transaction back (a full disk during a
    /// statement with a statement journal undoes only that statement, and a later COMMIT
    /// would publish the frames that were never written).
    fn flush(&mut self) -> c_int {
        if self.gathered.is_empty() {
            return ffi::SQLITE_OK;
        }
        // Never more than GATHER_LIMIT bytes, which is well within an int.
        let Ok(len) = c_int::try_from(self.gathered.len()) else {
            self.gathered.clear();
            return ffi::SQLITE_IOERR_WRITE;
        };
        #[cfg(test)]
        tests::count_write();
        // SAFETY: `real` is this file's opened platform file; the buffer is valid for `len`
        // bytes for the call.
        let rc = unsafe {
            match methods(self.real).xWrite {
                Some(write) => write(self.real, self.gathered.as_ptr().cast(), len, self.at),
                None => ffi::SQLITE_IOERR_WRITE,
            }
        };
        #[cfg(test)]
        let rc = tests::injected_failure().unwrap_or(rc);
        self.gathered.clear();
        if rc == ffi::SQLITE_OK {
            rc
        } else {
            ffi::SQLITE_IOERR_WRITE
        }
    }

    /// Where the gathered bytes end in the file.
    fn end(&self) -> i64 {
        // Never more than GATHER_LIMIT bytes.
        self.at + i64::try_from(self.gathered.len()).unwrap_or(i64::MAX)
    }
}

/// Runs `then` on the platform's file once the gathered writes are written; a failed write
/// is the answer instead.
///
/// # Safety
/// As for [`wal`].
unsafe fn flushed(
    file: *mut ffi::sqlite3_file,
    then: impl FnOnce(*mut ffi::sqlite3_file, &ffi::sqlite3_io_methods) -> c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let wal = unsafe { wal(file) };
    let rc = wal.flush();
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    // SAFETY: `real` is opened while `file` is.
    then(wal.real, unsafe { methods(wal.real) })
}

unsafe extern "C" fn wal_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes an opened `-wal` file once; after this, nothing uses it.
    let wal = unsafe { wal(file) };
    let written = wal.flush();
    // SAFETY: `real` is opened, and closed once, here.
    unsafe { close_real(wal.real) };
    // SAFETY: `open` wrote this `WalFile`; it is dropped once, and SQLite frees the memory.
    unsafe { ptr::drop_in_place(file.cast::<WalFile>()) };
    written
}

unsafe extern "C" fn wal_read(
    file: *mut ffi::sqlite3_file,
    buffer: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    #[cfg(test)]
    let _reading = tests::Reading::new();
    // SAFETY: SQLite's call on a file `open` opened; the arguments are handed on.
    unsafe {
        flushed(file, |real, methods| match methods.xRead {
            Some(read) => read(real, buffer, amount, offset),
            None => ffi::SQLITE_IOERR_READ,
        })
    }
}

unsafe extern "C" fn wal_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened.
    let wal = unsafe { wal(file) };
    let Ok(len) = usize::try_from(amount) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    if !wal.gathered.is_empty() && (offset != wal.end() || wal.gathered.len() + len > GATHER_LIMIT)
    {
        let rc = wal.flush();
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    if len > GATHER_LIMIT {
        #[cfg(test)]
        tests::count_write();
        // SAFETY: SQLite's arguments, handed on to the platform's file.
        return unsafe {
            match methods(wal.real).xWrite {
                Some(write) => write(wal.real, data, amount, offset),
                None => ffi::SQLITE_IOERR_WRITE,
            }
        };
    }
    if len == 0 {
        return ffi::SQLITE_OK;
    }
    if wal.gathered.is_empty() {
        wal.at = offset;
    }
    // SAFETY: SQLite's buffer holds `amount` bytes (more than 0) for the call; they are copied.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    wal.gathered.extend_from_slice(bytes);
    ffi::SQLITE_OK
}

unsafe extern "C" fn wal_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened.
    unsafe {
        flushed(file, |real, methods| match methods.xTruncate {
            Some(truncate) => truncate(real, size),
            None => ffi::SQLITE_IOERR_TRUNCATE,
        })
    }
}

unsafe extern "C" fn wal_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened.
    unsafe {
        flushed(file, |real, methods| match methods.xSync {
            Some(sync) => sync(real, flags),
            None => ffi::SQLITE_IOERR_FSYNC,
        })
    }
}

unsafe extern "C" fn wal_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened.
    unsafe {
        flushed(file, |real, methods| match methods.xFileSize {
            Some(file_size) => file_size(real, size),
            None => ffi::SQLITE_IOERR_FSTAT,
        })
    }
}

unsafe extern "C" fn wal_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened, handed on.
    unsafe {
        let real = wal(file).real;
        match methods(real).xLock {
            Some(lock) => lock(real, level),
            None => ffi::SQLITE_IOERR_LOCK,
        }
    }
}

unsafe extern "C" fn wal_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened, handed on.
    unsafe {
        let real = wal(file).real;
        match methods(real).xUnlock {
            Some(unlock) => unlock(real, level),
            None => ffi::SQLITE_IOERR_UNLOCK,
        }
    }
}

unsafe extern "C" fn wal_check_reserved_lock(
    file: *mut ffi::sqlite3_file,
    reserved: *mut c_int,
) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened, handed on.
    unsafe {
        let real = wal(file).real;
        match methods(real).xCheckReservedLock {
            Some(check) => check(real, reserved),
            None => ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
        }
    }
}

unsafe extern "C" fn wal_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened. A file control may size, map or name the
    // file: the platform's file is brought up to date first.
    unsafe {
        flushed(file, |real, methods| match methods.xFileControl {
            Some(control) => control(real, op, arg),
            None => ffi::SQLITE_NOTFOUND,
        })
    }
}

unsafe extern "C" fn wal_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened, handed on.
    unsafe {
        let real = wal(file).real;
        methods(real)
            .xSectorSize
            .map_or(4096, |sector_size| sector_size(real))
    }
}

unsafe extern "C" fn wal_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened, handed on.
    unsafe {
        let real = wal(file).real;
        methods(real)
            .xDeviceCharacteristics
            .map_or(0, |characteristics| characteristics(real))
    }
}

unsafe extern "C" fn wal_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened, handed on (SQLite maps the database's
    // shared memory, never the log's; this is the platform's answer all the same).
    unsafe {
        let real = wal(file).real;
        match methods(real).xShmMap {
            Some(map) => map(real, region, size, extend, out),
            None => ffi::SQLITE_IOERR_SHMMAP,
        }
    }
}

unsafe extern "C" fn wal_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    count: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened, handed on.
    unsafe {
        let real = wal(file).real;
        match methods(real).xShmLock {
            Some(lock) => lock(real, offset, count, flags),
            None => ffi::SQLITE_IOERR_SHMLOCK,
        }
    }
}

unsafe extern "C" fn wal_shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: SQLite's call on a file `open` opened, handed on.
    unsafe {
        let real = wal(file).real;
        if let Some(barrier) = methods(real).xShmBarrier {
            barrier(real);
        }
    }
}

unsafe extern "C" fn wal_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened, handed on.
    unsafe {
        let real = wal(file).real;
        match methods(real).xShmUnmap {
            Some(unmap) => unmap(real, delete),
            None => ffi::SQLITE_OK,
        }
    }
}

unsafe extern "C" fn wal_fetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened. A mapping reads the file, so the
    // gathered writes are written first; without the platform's method, nothing is mapped
    // (null), and SQLite reads instead.
    unsafe {
        flushed(file, |real, methods| match methods.xFetch {
            Some(fetch) => fetch(real, offset, amount, out),
            None => {
                *out = ptr::null_mut();
                ffi::SQLITE_OK
            }
        })
    }
}

unsafe extern "C" fn wal_unfetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    page: *mut c_void,
) -> c_int {
    // SAFETY: SQLite's call on a file `open` opened, handed on.
    unsafe {
        let real = wal(file).real;
        match methods(real).xUnfetch {
            Some(unfetch) => unfetch(real, offset, page),
            None => ffi::SQLITE_OK,
        }
    }
}

#[cfg(test)]
mod tests;
