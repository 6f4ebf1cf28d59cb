//! What an algorithm's state is written as in the state file (`STATE_FILE`), and the reader
//! it is read back with: each algorithm writes and checks its own state
//! ([`Algorithm::save_state`](super::Algorithm::save_state),
//! [`Algorithm::load_state`](super::Algorithm::load_state)), the file around it is the state
//! file's. Integers are little-endian.

/// Append `value`, little-endian.
pub fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Append `value`, little-endian.
pub fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// A saved state's bytes, read in order: every read checked against what is left, so a
/// hostile file can make nothing read past its end or allocate more than its size.
#[derive(Debug)]
pub struct StateReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// What is wrong with a saved state, in a few words (the state file adds where).
pub type Corrupt = &'static str;

impl<'a> StateReader<'a> {
    /// Read `bytes` from position `at`.
    pub fn new(bytes: &'a [u8], at: usize) -> StateReader<'a> {
        StateReader { bytes, at }
    }

    /// The position of the next byte read.
    pub fn at(&self) -> usize {
        self.at
    }

    /// Bytes left to read.
    pub fn left(&self) -> usize {
        self.bytes.len().saturating_sub(self.at)
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Corrupt> {
        if n > self.left() {
            return Err("ends in the middle of a value");
        }
        let taken = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(taken)
    }

    /// The next `N` bytes, as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Corrupt> {
        let mut array = [0; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    /// The next byte.
    pub fn u8(&mut self) -> Result<u8, Corrupt> {
        Ok(self.array::<1>()?[0])
    }

    /// The next `u16`.
    pub fn u16(&mut self) -> Result<u16, Corrupt> {
        self.array().map(u16::from_le_bytes)
    }

    /// The next `u32`.
    pub fn u32(&mut self) -> Result<u32, Corrupt> {
        self.array().map(u32::from_le_bytes)
    }

    /// The next `u64`.
    pub fn u64(&mut self) -> Result<u64, Corrupt> {
        self.array().map(u64::from_le_bytes)
    }
}
