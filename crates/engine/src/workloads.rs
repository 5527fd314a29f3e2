//! The four standard scheduling workloads (W1 independent, W2 chain, W3 random, W4 fan), their
//! splitmix64 generator and checksum; shared by the tests, the `engine-bench` example and the
//! criterion bench so all measure the same tasks.

/// One task of a workload: the variable it writes (if any) and those it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskRef<'a> {
    /// The written variable's index.
    pub write: Option<u32>,
    /// The read variables' indices, in draw order.
    pub reads: &'a [u32],
}

/// A workload: `nvars` variables and a list of tasks over them (stored flat).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// `W1` .. `W4`.
    pub name: &'static str,
    /// Number of variables.
    pub nvars: usize,
    writes: Vec<Option<u32>>,
    read_start: Vec<u32>,
    reads: Vec<u32>,
}

/// The splitmix64 generator the issue specifies (state starts at 42 for W3).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator with the given state.
    pub fn new(state: u64) -> Self {
        SplitMix64(state)
    }

    /// The next draw.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The expected checksums of the four workloads (from the issue).
pub const CHECKSUMS: [(&str, u64); 4] = [
    ("W1", 0x949b_0765_52cc_6883),
    ("W2", 0xf4ec_990a_df8c_6283),
    ("W3", 0xa405_d357_e435_4992),
    ("W4", 0x54f4_12db_cb68_b543),
];

impl Workload {
    fn empty(name: &'static str, nvars: usize, ntasks: usize) -> Self {
        Workload {
            name,
            nvars,
            writes: Vec::with_capacity(ntasks),
            read_start: Vec::with_capacity(ntasks + 1),
            reads: Vec::new(),
        }
    }

    fn add(&mut self, write: Option<u32>, reads: &[u32]) {
        if self.read_start.is_empty() {
            self.read_start.push(0);
        }
        self.writes.push(write);
        self.reads.extend_from_slice(reads);
        self.read_start.push(self.reads.len() as u32);
    }

    /// W1 independent: 1,000 variables, 100,000 tasks, task `i` writes variable `i % 1000`.
    pub fn w1() -> Self {
        let mut w = Self::empty("W1", 1000, 100_000);
        for i in 0..100_000u32 {
            w.add(Some(i % 1000), &[]);
        }
        w
    }

    /// W2 chain: 1 variable, 100,000 tasks all writing it.
    pub fn w2() -> Self {
        let mut w = Self::empty("W2", 1, 100_000);
        for _ in 0..100_000 {
            w.add(Some(0), &[]);
        }
        w
    }

    /// W3 random: 100 variables, 100,000 tasks, each writing one variable and reading 2..19
    /// others (splitmix64 from state 42).
    pub fn w3() -> Self {
        Self::random("W3", 100, 100_000, 42)
    }

    /// The W3 generator with other sizes and seeds: `nvars` variables (at least 20), `ntasks`
    /// tasks, each writing `draw % nvars` and reading `2 + draw % 18` distinct others.
    ///
    /// # Panics
    /// If `nvars < 20` (there would not be 19 other variables to read).
    pub fn random(name: &'static str, nvars: usize, ntasks: usize, seed: u64) -> Self {
        assert!(
            nvars >= 20,
            "the random workload needs at least 20 variables"
        );
        let n = nvars as u64;
        let mut rng = SplitMix64::new(seed);
        let mut w = Self::empty(name, nvars, ntasks);
        let mut pool: Vec<u32> = Vec::with_capacity(nvars);
        let mut reads: Vec<u32> = Vec::with_capacity(19);
        for _ in 0..ntasks {
            let write = (rng.next_u64() % n) as u32;
            let k = 2 + rng.next_u64() % 18;
            pool.clear();
            pool.extend((0..nvars as u32).filter(|&v| v != write));
            reads.clear();
            for j in 0..k {
                let r = j + rng.next_u64() % (n - 1 - j);
                pool.swap(j as usize, r as usize);
                reads.push(pool[j as usize]);
            }
            w.add(Some(write), &reads);
        }
        w
    }

    /// W4 fan: 1,000 rounds of one writer then 64 readers of one variable (65,000 tasks).
    pub fn w4() -> Self {
        let mut w = Self::empty("W4", 1, 65_000);
        for _ in 0..1000 {
            w.add(Some(0), &[]);
            for _ in 0..64 {
                w.add(None, &[0]);
            }
        }
        w
    }

    /// The workload named `W1` .. `W4` (case-insensitive).
    pub fn by_name(name: &str) -> Option<Self> {
        match name.to_ascii_uppercase().as_str() {
            "W1" => Some(Self::w1()),
            "W2" => Some(Self::w2()),
            "W3" => Some(Self::w3()),
            "W4" => Some(Self::w4()),
            _ => None,
        }
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Whether there are no tasks.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Task `i`.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn task(&self, i: usize) -> TaskRef<'_> {
        let (a, b) = (self.read_start[i] as usize, self.read_start[i + 1] as usize);
        TaskRef {
            write: self.writes[i],
            reads: &self.reads[a..b],
        }
    }

    /// The tasks in order.
    pub fn tasks(&self) -> impl Iterator<Item = TaskRef<'_>> + '_ {
        (0..self.len()).map(|i| self.task(i))
    }

    /// The first `n` tasks (for warm-up passes).
    pub fn prefix(&self, n: usize) -> Self {
        let n = n.min(self.len());
        let mut w = Self::empty(self.name, self.nvars, n);
        for t in self.tasks().take(n) {
            w.add(t.write, t.reads);
        }
        w
    }

    /// The FNV-1a-style checksum of the issue: over each task's 32-bit words (written variable
    /// or -1, number of reads, the reads), `h ^= x; h *= 1099511628211` from
    /// `1469598103934665603`.
    pub fn checksum(&self) -> u64 {
        let mut h: u64 = 1_469_598_103_934_665_603;
        let mut mix = |x: u32| {
            h ^= u64::from(x);
            h = h.wrapping_mul(1_099_511_628_211);
        };
        for t in self.tasks() {
            mix(t.write.unwrap_or(u32::MAX));
            mix(t.reads.len() as u32);
            for &r in t.reads {
                mix(r);
            }
        }
        h
    }
}
