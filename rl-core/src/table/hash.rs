//! The keyed hash a table finds a key's state by: AES-CMAC (RFC 4493,
//! NIST SP 800-38B) keyed with the table's 128-bit seed, of the line id (8
//! bytes, little-endian) followed by the key bytes.
//!
//! The 128-bit result is the state's identity (the key bytes are not
//! stored), so it must be a pseudo-random function of the key: anyone who
//! can pick the keys (a client picks its address' low bits, or its API key)
//! must not be able to make two keys collide, nor fill one bucket chain,
//! without knowing the seed. CMAC over AES-128 is such a function, and with
//! the AES instructions x86-64 and ARMv8 have, a key of up to 8 bytes (an
//! IPv4 or IPv6 prefix, a short token) is one block, one encryption. The
//! `aes` crate detects those instructions at run time and otherwise computes
//! the same function in constant-time software.

use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128;

/// The cipher and CMAC subkeys for one seed: worked out once per table (a
/// key schedule costs more than a hash).
#[derive(Clone)]
pub struct KeyHash {
    aes: Aes128,
    /// CMAC's K1 (a complete last block) and K2 (a padded one).
    k1: u128,
    k2: u128,
}

impl KeyHash {
    /// The hash keyed with `seed` (the AES key: both words, little-endian).
    pub fn new(seed: [u64; 2]) -> KeyHash {
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&seed[0].to_le_bytes());
        key[8..].copy_from_slice(&seed[1].to_le_bytes());
        let aes = Aes128::new(&GenericArray::from(key));
        let mut hash = KeyHash { aes, k1: 0, k2: 0 };
        // RFC 4493 2.3: L = AES(0); K1 = L·x, K2 = K1·x in GF(2^128).
        let l = u128::from_be_bytes(hash.encrypt(0));
        hash.k1 = double(l);
        hash.k2 = double(hash.k1);
        hash
    }

    /// The 128-bit identity of `key` for line `line_id`: the CMAC as two
    /// little-endian words.
    pub fn hash(&self, line_id: u64, key: &[u8]) -> [u64; 2] {
        // The message is line_id (8 bytes) ‖ key: its first block holds up to 8 key bytes.
        let (head, rest) = key.split_at(key.len().min(8));
        let first = (u128::from(load_le(head)) << 64 | u128::from(line_id)).to_le_bytes();
        let mac = if rest.is_empty() {
            self.last(0, first, 8 + head.len())
        } else {
            let mut x = self.encrypt(u128::from_ne_bytes(first));
            let (blocks, tail) = rest.as_chunks::<16>();
            // The last block is the tail, or (no tail) the last whole block.
            let (whole, last, len) = match (tail.len(), blocks.split_last()) {
                (0, Some((last, whole))) => (whole, *last, 16),
                _ => {
                    let mut last = [0u8; 16];
                    last[..tail.len()].copy_from_slice(tail);
                    (blocks, last, tail.len())
                }
            };
            for b in whole {
                x = self.encrypt(u128::from_ne_bytes(x) ^ u128::from_ne_bytes(*b));
            }
            self.last(u128::from_ne_bytes(x), last, len)
        };
        [u64::from_le_bytes(head8(&mac, 0)), u64::from_le_bytes(head8(&mac, 8))]
    }

    /// CMAC's final step: the last block (`len` bytes of it the message's,
    /// padded with 0x80 0… when fewer than 16) on the chaining value `x`.
    fn last(&self, x: u128, mut block: [u8; 16], len: usize) -> [u8; 16] {
        let k = match len {
            16 => self.k1,
            _ => {
                if let Some(b) = block.get_mut(len) {
                    *b = 0x80;
                }
                self.k2
            }
        };
        self.encrypt(x ^ u128::from_ne_bytes(block) ^ u128::from_ne_bytes(k.to_be_bytes()))
    }

    /// One AES-128 encryption of the block whose bytes `b` holds natively.
    fn encrypt(&self, b: u128) -> [u8; 16] {
        let mut block = GenericArray::from(b.to_ne_bytes());
        self.aes.encrypt_block(&mut block);
        block.into()
    }
}

/// Multiplication by x in GF(2^128), as CMAC's subkeys are made.
fn double(v: u128) -> u128 {
    (v << 1) ^ if v >> 127 == 1 { 0x87 } else { 0 }
}

/// Up to 8 bytes as a little-endian word, with a few loads rather than a
/// copy of variable length (a call to `memcpy`).
fn load_le(b: &[u8]) -> u64 {
    let n = b.len();
    let word = |at: usize| b.get(at..at + 4).and_then(|w| w.try_into().ok()).map_or(0, u32::from_le_bytes);
    let byte = |at: usize| b.get(at).map_or(0, |&x| u64::from(x));
    match n {
        0 => 0,
        // Two overlapping words: the bytes they share are the same.
        4..=8 => u64::from(word(0)) | u64::from(word(n - 4)) << (8 * (n - 4)),
        _ => byte(0) | byte(n / 2) << (8 * (n / 2)) | byte(n - 1) << (8 * (n - 1)),
    }
}

/// Bytes `at..at + 8` of a block.
fn head8(b: &[u8; 16], at: usize) -> [u8; 8] {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    w
}
