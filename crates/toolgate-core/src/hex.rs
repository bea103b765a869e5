//! Lower-case hexadecimal text of bytes (digests, MACs, key ids): one table lookup per digit.
//!
//! The ledger writes several digests per call (event MACs, content hashes, the bearer token's
//! hash), so this is on every call's path; the `hex` crate's `encode` collects its digits as
//! an iterator of `char`s, several times the work.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The two digits of a byte.
fn digits(byte: u8) -> [u8; 2] {
    [
        DIGITS[usize::from(byte >> 4)],
        DIGITS[usize::from(byte & 0x0f)],
    ]
}

/// `bytes` as lower-case hexadecimal, two digits per byte.
pub fn encode(bytes: impl AsRef<[u8]>) -> String {
    let mut text = Vec::new();
    encode_into(bytes, &mut text);
    String::from_utf8(text).expect("hexadecimal digits are ASCII")
}

/// Appends `bytes` to `out` as lower-case hexadecimal, two digits per byte.
pub fn encode_into(bytes: impl AsRef<[u8]>, out: &mut Vec<u8>) {
    let bytes = bytes.as_ref();
    let start = out.len();
    // Sized once, then filled in place: no capacity check per digit.
    out.resize(start + bytes.len() * 2, 0);
    for (pair, &byte) in out[start..].chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&digits(byte));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_two_lower_case_digits() {
        let all: Vec<u8> = (0..=255).collect();
        let text = encode(&all);
        assert_eq!(text.len(), 512);
        for (byte, pair) in all.iter().zip(text.as_bytes().chunks(2)) {
            assert_eq!(pair, format!("{byte:02x}").as_bytes());
        }
        let mut out = b"x=".to_vec();
        encode_into([0xde, 0xad, 0x01], &mut out);
        assert_eq!(out, b"x=dead01");
        assert_eq!(encode([]), "");
    }
}
