//! The `-wal` file's methods called one by one, as SQLite would call them, with the file on
//! disk read after each: which calls keep a write gathered, and which hand the gathered bytes
//! to the platform's file first (and in the order they were written).

use std::ffi::{CString, c_int, c_void};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::ptr;

use rusqlite::ffi;

use super::super::{GATHER_LIMIT, NAME_C, register};
use super::wal_writes;

/// A `-wal` file opened through this VFS's `xOpen`, closed when dropped (unless closed by the
/// test), with a model of what the file should hold once every gathered byte is written.
struct Log {
    /// The file object: this VFS's `szOsFile` bytes, 8-aligned.
    memory: Vec<u64>,
    /// The database's filename (made by `sqlite3_create_filename`), which holds the log's.
    name: ffi::sqlite3_filename,
    path: PathBuf,
    open: bool,
    expected: Vec<u8>,
}

impl Log {
    fn open(dir: &Path) -> Log {
        register().unwrap();
        let database = dir.join("log.db");
        // The platform's `xOpen` of a log takes its mode from the database file's.
        std::fs::write(&database, b"").unwrap();
        let path = dir.join("log.db-wal");
        let c = |path: &Path| CString::new(path.as_os_str().as_bytes()).unwrap();
        let (database_c, journal_c, wal_c) =
            (c(&database), c(&dir.join("log.db-journal")), c(&path));
        // SAFETY: three C strings valid for the call; no URI parameters. SQLite copies them.
        let name = unsafe {
            ffi::sqlite3_create_filename(
                database_c.as_ptr(),
                journal_c.as_ptr(),
                wal_c.as_ptr(),
                0,
                ptr::null_mut(),
            )
        };
        assert!(!name.is_null());
        // SAFETY: a filename made by `sqlite3_create_filename`; the log's name is inside it,
        // as SQLite hands it to `xOpen` for the log.
        let wal_name = unsafe { ffi::sqlite3_filename_wal(name) };
        // SAFETY: this VFS is registered (above) and stays so.
        let vfs = unsafe { ffi::sqlite3_vfs_find(NAME_C.as_ptr()) };
        assert!(!vfs.is_null());
        // SAFETY: a registered VFS, valid to read.
        let size = usize::try_from(unsafe { (*vfs).szOsFile }).unwrap();
        let mut log = Log {
            memory: vec![0; size.div_ceil(8)],
            name,
            path,
            open: false,
            expected: Vec::new(),
        };
        let mut out_flags = 0;
        let flags = ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_CREATE | ffi::SQLITE_OPEN_WAL;
        // SAFETY: as SQLite calls it: the VFS's own `xOpen`, with `szOsFile` zeroed bytes,
        // 8-aligned, and the log's name within a filename made by `sqlite3_create_filename`.
        let rc =
            unsafe { (*vfs).xOpen.unwrap()(vfs, wal_name, log.file(), flags, &raw mut out_flags) };
        assert_eq!(rc, ffi::SQLITE_OK);
        log.open = true;
        log
    }

    fn file(&mut self) -> *mut ffi::sqlite3_file {
        self.memory.as_mut_ptr().cast()
    }

    fn methods(&mut self) -> &'static ffi::sqlite3_io_methods {
        assert!(self.open);
        // SAFETY: an opened file's method table is set and static.
        unsafe { &*(*self.file()).pMethods }
    }

    /// Writes `len` bytes at `at` (each byte a function of its offset and `seed`).
    fn write(&mut self, at: usize, len: usize, seed: u8) {
        let bytes: Vec<u8> = (0..len)
            .map(|i| u8::try_from((at + i) % 251).unwrap() ^ seed)
            .collect();
        let write = self.methods().xWrite.unwrap();
        let file = self.file();
        // SAFETY: an opened file and a buffer of `len` bytes.
        let rc = unsafe {
            write(
                file,
                bytes.as_ptr().cast(),
                c_int::try_from(len).unwrap(),
                i64::try_from(at).unwrap(),
            )
        };
        assert_eq!(rc, ffi::SQLITE_OK);
        if self.expected.len() < at + len {
            self.expected.resize(at + len, 0);
        }
        self.expected[at..at + len].copy_from_slice(&bytes);
    }

    fn read(&mut self, at: usize, len: usize) -> Vec<u8> {
        let mut buffer = vec![0u8; len];
        let read = self.methods().xRead.unwrap();
        let file = self.file();
        // SAFETY: an opened file and a buffer of `len` bytes.
        let rc = unsafe {
            read(
                file,
                buffer.as_mut_ptr().cast::<c_void>(),
                c_int::try_from(len).unwrap(),
                i64::try_from(at).unwrap(),
            )
        };
        assert_eq!(rc, ffi::SQLITE_OK);
        buffer
    }

    fn size(&mut self) -> usize {
        let mut size = 0;
        let file_size = self.methods().xFileSize.unwrap();
        let file = self.file();
        // SAFETY: an opened file and a place for the answer.
        assert_eq!(unsafe { file_size(file, &raw mut size) }, ffi::SQLITE_OK);
        usize::try_from(size).unwrap()
    }

    fn truncate(&mut self, size: usize) {
        let truncate = self.methods().xTruncate.unwrap();
        let file = self.file();
        // SAFETY: an opened file.
        let rc = unsafe { truncate(file, i64::try_from(size).unwrap()) };
        assert_eq!(rc, ffi::SQLITE_OK);
        self.expected.truncate(size);
    }

    fn sync(&mut self) {
        let sync = self.methods().xSync.unwrap();
        let file = self.file();
        // SAFETY: an opened file.
        assert_eq!(unsafe { sync(file, ffi::SQLITE_SYNC_FULL) }, ffi::SQLITE_OK);
    }

    fn close(&mut self) {
        let close = self.methods().xClose.unwrap();
        let file = self.file();
        // SAFETY: an opened file, closed once.
        assert_eq!(unsafe { close(file) }, ffi::SQLITE_OK);
        self.open = false;
    }

    /// What the file holds on disk now.
    fn on_disk(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }

    /// Asserts that every byte written so far is on disk, as written.
    fn assert_written(&self) {
        assert_eq!(self.on_disk(), self.expected, "the file holds every write");
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if self.open {
            self.close();
        }
        // SAFETY: made by `sqlite3_create_filename`, freed once, after the file's close.
        unsafe { ffi::sqlite3_free_filename(self.name) };
    }
}

#[test]
fn writes_that_follow_each_other_wait_and_anything_else_writes_them_first_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path());
    let before = wal_writes();

    // A header and two frames, each following the last: nothing reaches the file yet.
    log.write(0, 32, 1);
    log.write(32, 24, 2);
    log.write(56, 4096, 3);
    assert_eq!(wal_writes(), before);
    assert!(log.on_disk().is_empty(), "gathered, not written");

    // A write elsewhere in the file (here, back over the header, as SQLite rewrites a frame
    // a transaction changes again) hands the gathered bytes over first, in one write, and is
    // gathered itself.
    log.write(8, 16, 4);
    assert_eq!(wal_writes(), before + 1);
    assert_eq!(log.on_disk().len(), 56 + 4096);
    assert_ne!(log.on_disk(), log.expected, "the rewrite is still gathered");

    // The size asks the file: the rewrite is written before it answers.
    assert_eq!(log.size(), 56 + 4096);
    assert_eq!(wal_writes(), before + 2);
    log.assert_written();

    // A read sees what was gathered, from the file.
    log.write(4152, 100, 5);
    assert_eq!(log.read(4152, 100), log.expected[4152..4252]);
    log.assert_written();

    // A truncation comes after the gathered bytes are written, so it cuts them too.
    log.write(4252, 4096, 6);
    log.truncate(4200);
    assert_eq!(log.on_disk().len(), 4200);
    log.assert_written();

    // A sync writes them.
    log.write(4200, 500, 7);
    log.sync();
    log.assert_written();

    // Past the limit, the gathered bytes go first, then the next ones start a new gathering.
    let writes = wal_writes();
    let frame = 24 + 4096;
    let at = log.expected.len();
    for n in 0..(GATHER_LIMIT / frame + 1) {
        log.write(at + n * frame, frame, 8);
    }
    assert_eq!(
        wal_writes(),
        writes + 1,
        "one write, when the limit was reached"
    );
    log.sync();
    assert_eq!(wal_writes(), writes + 2);
    log.assert_written();

    // A write larger than the limit is not gathered: it follows the gathered bytes.
    let at = log.expected.len();
    log.write(at, 10, 9);
    log.write(at + 10, GATHER_LIMIT + 1, 10);
    assert_eq!(wal_writes(), writes + 4);
    log.assert_written();

    // The close writes what is left.
    let at = log.expected.len();
    log.write(at, 333, 11);
    log.close();
    log.assert_written();
}

#[test]
fn a_file_control_writes_the_gathered_bytes_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path());
    log.write(0, 4120, 1);
    assert!(log.on_disk().is_empty());
    let mut size: i64 = 1 << 20;
    let control = log.methods().xFileControl.unwrap();
    let file = log.file();
    // SAFETY: an opened file; SQLITE_FCNTL_SIZE_HINT takes a pointer to an i64.
    let rc = unsafe {
        control(
            file,
            ffi::SQLITE_FCNTL_SIZE_HINT,
            (&raw mut size).cast::<c_void>(),
        )
    };
    assert_eq!(rc, ffi::SQLITE_OK);
    assert_eq!(&log.on_disk()[..4120], &log.expected[..]);
}
