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
//! IPv4 or IPv6 prefix, a short token) is one block, one encryption.
//!
//! On x86-64 with AES-NI (detected once, when the hash is keyed) the
//! encryptions are the instructions themselves, and the hash of a key of up
//! to 8 bytes inlines into its caller, the request handler: the hash is on
//! every request's path, where a call into the `aes` crate's block
//! interface (its run-time dispatch, its byte-array conversions) cost more
//! than the ten rounds. Elsewhere the `aes` crate computes the same function
//! (with ARMv8's instructions where it detects them, else in constant-time
//! software).

use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128;

/// The cipher and CMAC subkeys for one seed: worked out once per table (a
/// key schedule costs more than a hash).
#[derive(Clone)]
pub struct KeyHash {
    aes: Aes128,
    /// The round keys for AES-NI, where the CPU has it.
    #[cfg(target_arch = "x86_64")]
    ni: Option<ni::RoundKeys>,
    /// CMAC's K1 (a complete last block) and K2 (a padded one), as blocks
    /// (see [`Encrypt`]): what is XORed into the last block.
    k1: u128,
    k2: u128,
}

/// One AES-128 encryption of a block: its bytes are the word's,
/// little-endian (the order x86-64 keeps an XMM register's bytes in).
trait Encrypt {
    fn encrypt(&self, b: u128) -> u128;
}

/// The `aes` crate's cipher.
impl Encrypt for Aes128 {
    #[inline(always)]
    fn encrypt(&self, b: u128) -> u128 {
        let mut block = GenericArray::from(b.to_le_bytes());
        self.encrypt_block(&mut block);
        u128::from_le_bytes(block.into())
    }
}

impl KeyHash {
    /// The hash keyed with `seed` (the AES key: both words, little-endian).
    pub fn new(seed: [u64; 2]) -> KeyHash {
        let mut hash = KeyHash::portable(seed);
        #[cfg(target_arch = "x86_64")]
        {
            hash.ni = ni::RoundKeys::new(key_bytes(seed));
        }
        hash
    }

    /// The hash keyed with `seed`, computed by the `aes` crate whatever the
    /// CPU has (the same function as [`KeyHash::new`]'s: for tests).
    #[doc(hidden)]
    pub fn portable(seed: [u64; 2]) -> KeyHash {
        let aes = Aes128::new(&GenericArray::from(key_bytes(seed)));
        // RFC 4493 2.3: L = AES(0); K1 = L·x, K2 = K1·x in GF(2^128).
        let l = u128::from_be_bytes(aes.encrypt(0).to_le_bytes());
        let k1 = double(l);
        let k2 = double(k1);
        let block = |k: u128| u128::from_le_bytes(k.to_be_bytes());
        KeyHash {
            aes,
            #[cfg(target_arch = "x86_64")]
            ni: None,
            k1: block(k1),
            k2: block(k2),
        }
    }

    /// The 128-bit identity of `key` for line `line_id`: the CMAC as two
    /// little-endian words.
    #[inline(always)]
    pub fn hash(&self, line_id: u64, key: &[u8]) -> [u64; 2] {
        // The common key (an address, a short token) with AES-NI: one block, inline.
        #[cfg(target_arch = "x86_64")]
        if let (Some(rk), true) = (&self.ni, key.len() <= 8) {
            return words(self.one_block(rk, line_id, key));
        }
        self.hash_any(line_id, key)
    }

    /// [`KeyHash::hash`] of any key, on any CPU.
    #[inline(never)]
    fn hash_any(&self, line_id: u64, key: &[u8]) -> [u64; 2] {
        #[cfg(target_arch = "x86_64")]
        if let Some(rk) = &self.ni {
            return words(self.cmac(rk, line_id, key));
        }
        words(self.cmac(&self.aes, line_id, key))
    }

    /// CMAC of line_id ‖ key, with `aes`'s encryptions.
    #[inline(always)]
    fn cmac(&self, aes: &impl Encrypt, line_id: u64, key: &[u8]) -> u128 {
        // The message is line_id (8 bytes) ‖ key: its first block holds up to 8 key bytes.
        let (head, rest) = key.split_at(key.len().min(8));
        if rest.is_empty() {
            return self.one_block(aes, line_id, head);
        }
        let first = u128::from(load_le(head)) << 64 | u128::from(line_id);
        let mut x = aes.encrypt(first);
        let (blocks, tail) = rest.as_chunks::<16>();
        // The last block is the tail, or (no tail) the last whole block.
        let (whole, last, k) = match (tail.len(), blocks.split_last()) {
            (0, Some((last, whole))) => (whole, u128::from_le_bytes(*last), self.k1),
            _ => {
                // (a tail is shorter than a block: its padding fits)
                let mut last = [0u8; 16];
                last[..tail.len()].copy_from_slice(tail);
                last[tail.len()] = 0x80;
                (blocks, u128::from_le_bytes(last), self.k2)
            }
        };
        for b in whole {
            x = aes.encrypt(x ^ u128::from_le_bytes(*b));
        }
        aes.encrypt(x ^ last ^ k)
    }

    /// CMAC of line_id ‖ key for a key of at most 8 bytes: one block,
    /// complete at 8 key bytes, else padded.
    #[inline(always)]
    fn one_block(&self, aes: &impl Encrypt, line_id: u64, key: &[u8]) -> u128 {
        let (high, k) = match key.len() {
            8 => (load_le(key), self.k1),
            // The padding's 0x80 right after the key, in the block's high word.
            n => (load_le(key) | 0x80 << (8 * (n & 7)), self.k2),
        };
        aes.encrypt((u128::from(high) << 64 | u128::from(line_id)) ^ k)
    }
}

/// A MAC as the two little-endian words of its bytes.
#[inline(always)]
fn words(mac: u128) -> [u64; 2] {
    [mac as u64, (mac >> 64) as u64]
}

/// The AES key of a seed: both words, little-endian.
fn key_bytes(seed: [u64; 2]) -> [u8; 16] {
    (u128::from(seed[1]) << 64 | u128::from(seed[0])).to_le_bytes()
}

/// Multiplication by x in GF(2^128), as CMAC's subkeys are made.
fn double(v: u128) -> u128 {
    (v << 1) ^ if v >> 127 == 1 { 0x87 } else { 0 }
}

/// Up to 8 bytes as a little-endian word, with a few loads rather than a
/// copy of variable length (a call to `memcpy`).
#[inline(always)]
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

/// AES-128 with x86-64's AES-NI instructions.
#[cfg(target_arch = "x86_64")]
mod ni {
    use core::arch::x86_64::{__m128i, _mm_aeskeygenassist_si128, _mm_shuffle_epi32, _mm_slli_si128, _mm_xor_si128};

    /// The eleven round keys of one AES-128 key.
    #[derive(Clone, Copy)]
    pub struct RoundKeys([__m128i; 11]);

    impl RoundKeys {
        /// The round keys of `key`, or `None` where the CPU lacks AES-NI.
        pub fn new(key: [u8; 16]) -> Option<RoundKeys> {
            if !std::arch::is_x86_feature_detected!("aes") {
                return None;
            }
            // SAFETY: the CPU has AES-NI (and SSE2, which x86-64 always has).
            Some(unsafe { expand(key) })
        }
    }

    impl super::Encrypt for RoundKeys {
        /// The ten rounds, written as instructions (an `asm!` block needs no
        /// `aes` target feature, so it inlines into any caller, the request
        /// handler included).
        #[inline(always)]
        fn encrypt(&self, b: u128) -> u128 {
            // SAFETY: u128 and __m128i are 16 plain bytes, in the same order.
            let mut x = unsafe { core::mem::transmute::<u128, __m128i>(b) };
            // SAFETY: a RoundKeys exists only where the CPU has AES-NI (RoundKeys::new); the
            // instructions read the eleven 16-byte keys at k (aligned: __m128i is), write x alone,
            // and leave the flags and the stack alone.
            unsafe {
                core::arch::asm!(
                    "pxor {x}, [{k}]",
                    "aesenc {x}, [{k} + 16]",
                    "aesenc {x}, [{k} + 32]",
                    "aesenc {x}, [{k} + 48]",
                    "aesenc {x}, [{k} + 64]",
                    "aesenc {x}, [{k} + 80]",
                    "aesenc {x}, [{k} + 96]",
                    "aesenc {x}, [{k} + 112]",
                    "aesenc {x}, [{k} + 128]",
                    "aesenc {x}, [{k} + 144]",
                    "aesenclast {x}, [{k} + 160]",
                    x = inout(xmm_reg) x,
                    k = in(reg) self.0.as_ptr(),
                    options(pure, readonly, nostack, preserves_flags),
                );
            }
            // SAFETY: as above.
            unsafe { core::mem::transmute::<__m128i, u128>(x) }
        }
    }

    /// AES-128's key expansion (FIPS 197 5.2), as Intel's AES-NI white
    /// paper writes it.
    #[target_feature(enable = "aes")]
    unsafe fn expand(key: [u8; 16]) -> RoundKeys {
        // One round key from the previous one and AESKEYGENASSIST's word (its round constant).
        fn next(prev: __m128i, assist: __m128i) -> __m128i {
            // SAFETY: SSE2, x86-64's baseline.
            unsafe {
                let t = _mm_shuffle_epi32::<0xff>(assist);
                let mut k = _mm_xor_si128(prev, _mm_slli_si128::<4>(prev));
                k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
                k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
                _mm_xor_si128(k, t)
            }
        }
        // SAFETY: [u8; 16] and __m128i are 16 plain bytes.
        let k0 = unsafe { core::mem::transmute::<[u8; 16], __m128i>(key) };
        let mut k = [k0; 11];
        // The round constants are immediates: one call per round.
        macro_rules! round {
            ($i:literal, $rcon:literal) => {
                k[$i] = next(k[$i - 1], _mm_aeskeygenassist_si128::<$rcon>(k[$i - 1]));
            };
        }
        round!(1, 0x01);
        round!(2, 0x02);
        round!(3, 0x04);
        round!(4, 0x08);
        round!(5, 0x10);
        round!(6, 0x20);
        round!(7, 0x40);
        round!(8, 0x80);
        round!(9, 0x1b);
        round!(10, 0x36);
        RoundKeys(k)
    }
}
