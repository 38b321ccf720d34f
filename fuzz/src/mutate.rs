//! The generator and the mutator: deterministic for a given seed.

/// A splitmix64 generator: tiny, fast, and the same sequence everywhere.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A position in a buffer of `len` bytes, end included.
    fn position(&mut self, len: usize) -> usize {
        self.below(len as u64 + 1) as usize
    }

    /// True with probability 1/`n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// Integers at the edges, where length and count checks break.
const INTERESTING: [u64; 20] = [
    0,
    1,
    2,
    7,
    8,
    16,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
];

/// Mutates inputs drawn from a corpus.
#[derive(Debug, Clone)]
pub struct Mutator {
    dictionary: Vec<Vec<u8>>,
}

impl Mutator {
    /// A mutator that may also insert or overwrite with `dictionary` tokens.
    pub fn new(dictionary: Vec<Vec<u8>>) -> Self {
        Self { dictionary }
    }

    /// A mutant of a random corpus entry: one to four stacked mutations.
    pub fn mutate(&self, rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
        let mut input = corpus[rng.below(corpus.len() as u64) as usize].clone();
        let rounds = 1 + rng.below(4);
        for _ in 0..rounds {
            self.mutate_once(rng, corpus, &mut input);
        }
        input
    }

    fn mutate_once(&self, rng: &mut Rng, corpus: &[Vec<u8>], input: &mut Vec<u8>) {
        let len = input.len();
        match rng.below(10) {
            // Flip one bit.
            0 if len > 0 => {
                let at = rng.below(len as u64) as usize;
                input[at] ^= 1 << rng.below(8);
            }
            // Set one byte.
            1 if len > 0 => {
                let at = rng.below(len as u64) as usize;
                input[at] = rng.next_u64() as u8;
            }
            // Overwrite 1, 2, 4 or 8 bytes with an interesting integer,
            // little or big endian, sometimes off by one.
            2 if len > 0 => {
                let width = 1usize << rng.below(4);
                let mut value = INTERESTING[rng.below(INTERESTING.len() as u64) as usize];
                if rng.one_in(4) {
                    value = value.wrapping_add(rng.below(3)).wrapping_sub(1);
                }
                let bytes = if rng.one_in(2) {
                    value.to_le_bytes()
                } else {
                    value.to_be_bytes()
                };
                let bytes = if rng.one_in(2) {
                    &bytes[..width]
                } else {
                    &bytes[8 - width..]
                };
                let at = rng.below(len as u64) as usize;
                let end = (at + width).min(len);
                input[at..end].copy_from_slice(&bytes[..end - at]);
            }
            // Truncate.
            3 => input.truncate(rng.position(len)),
            // Splice: this input's head, another entry's tail.
            4 => {
                let other = &corpus[rng.below(corpus.len() as u64) as usize];
                let head = rng.position(len);
                let tail = rng.position(other.len());
                input.truncate(head);
                input.extend_from_slice(&other[tail..]);
            }
            // Insert random bytes.
            5 => {
                let at = rng.position(len);
                let count = 1 + rng.below(16) as usize;
                let bytes: Vec<u8> = (0..count).map(|_| rng.next_u64() as u8).collect();
                input.splice(at..at, bytes);
            }
            // Delete a range.
            6 if len > 0 => {
                let at = rng.below(len as u64) as usize;
                let end = (at + 1 + rng.below(32) as usize).min(len);
                input.drain(at..end);
            }
            // Duplicate a chunk in place (repeated fields, records).
            7 if len > 0 => {
                let at = rng.below(len as u64) as usize;
                let end = (at + 1 + rng.below(64) as usize).min(len);
                let chunk = input[at..end].to_vec();
                input.splice(at..at, chunk);
            }
            // Insert or overwrite with a dictionary token.
            8 | 9 if !self.dictionary.is_empty() => {
                let token = &self.dictionary[rng.below(self.dictionary.len() as u64) as usize];
                let at = rng.position(len);
                if rng.one_in(2) {
                    input.splice(at..at, token.iter().copied());
                } else {
                    let end = (at + token.len()).min(len);
                    input.splice(at..end, token.iter().copied());
                }
            }
            // Nothing fitted this input (empty, or no dictionary): grow it.
            _ => input.push(rng.next_u64() as u8),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_mutants() {
        let corpus = vec![b"hello world".to_vec(), vec![0; 40]];
        let mutator = Mutator::new(vec![b"{".to_vec()]);
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..200)
                .map(|_| mutator.mutate(&mut rng, &corpus))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn mutants_differ_from_their_seeds_and_vary_in_length() {
        let corpus = vec![b"0123456789abcdef".to_vec()];
        let mutator = Mutator::new(Vec::new());
        let mut rng = Rng::new(1);
        let mutants: Vec<Vec<u8>> = (0..1000)
            .map(|_| mutator.mutate(&mut rng, &corpus))
            .collect();
        let changed = mutants.iter().filter(|m| **m != corpus[0]).count();
        assert!(changed > 900, "{changed} of 1000 changed");
        let lengths: std::collections::BTreeSet<usize> = mutants.iter().map(Vec::len).collect();
        assert!(lengths.len() > 10, "{lengths:?}");
    }
}
