//! What the soak counted and every broken invariant, and the summary table it prints (and writes as JSON).

use std::collections::BTreeMap;

/// Counts of one client (merged into the run's).
#[derive(Debug, Default)]
pub struct Tally {
    pub ends: BTreeMap<String, u64>,
    pub reconnects: BTreeMap<String, u64>,
    /// The first message of each kind of failed call (`context: code`), to tell its cause.
    pub samples: BTreeMap<String, String>,
    pub notes: BTreeMap<String, u64>,
    pub failures: Vec<String>,
    /// Every INTERNAL a call answered, with where and its message: none may come, faults or not.
    pub internal: Vec<String>,
    pub bytes: u64,
}

impl Tally {
    pub fn ended(&mut self, reason: String) {
        *self.ends.entry(reason).or_default() += 1;
    }

    pub fn reconnect(&mut self, why: String) {
        *self.reconnects.entry(why).or_default() += 1;
    }

    /// A call that failed with `code` (`message`) at `context`: a reconnect, or an INTERNAL kept whole.
    pub fn status(&mut self, context: &str, code: tonic::Code, message: &str) {
        if code == tonic::Code::Internal {
            eprintln!("soak: INTERNAL at {context}: {message}");
            self.internal.push(format!("{context}: {message}"));
        }
        let key = format!("{context}: {code:?}");
        self.samples
            .entry(key.clone())
            .or_insert_with(|| message.chars().take(200).collect());
        self.reconnect(key);
    }

    pub fn note(&mut self, what: String) {
        *self.notes.entry(what).or_default() += 1;
    }

    pub fn fail(&mut self, what: String) {
        eprintln!("soak: BROKEN: {what}");
        self.failures.push(what);
    }

    pub fn merge(&mut self, other: Tally) {
        for (k, v) in other.ends {
            *self.ends.entry(k).or_default() += v;
        }
        for (k, v) in other.reconnects {
            *self.reconnects.entry(k).or_default() += v;
        }
        for (k, v) in other.samples {
            self.samples.entry(k).or_insert(v);
        }
        for (k, v) in other.notes {
            *self.notes.entry(k).or_default() += v;
        }
        self.failures.extend(other.failures);
        self.internal.extend(other.internal);
        self.bytes += other.bytes;
    }
}

/// One client's result.
#[derive(Debug, Default)]
pub struct Client {
    pub sandbox: String,
    pub tally: Tally,
}

/// The run's figures for the summary.
#[derive(Debug, Default)]
pub struct Summary {
    pub duration_s: u64,
    pub seed: u64,
    pub clients: usize,
    pub faults: BTreeMap<String, u64>,
    pub rss_baseline_kib: u64,
    pub rss_end_kib: u64,
    pub leftovers: Vec<String>,
    pub tally: Tally,
}

impl Summary {
    /// The invariants, each with whether it held.
    pub fn invariants(&self) -> Vec<(&'static str, bool)> {
        let rss_ok =
            // No sample in a window (a run too short to have one) is a failure, not a pass.
            self.rss_baseline_kib > 0 && self.rss_end_kib * 10 <= self.rss_baseline_kib * 11;
        vec![
            (
                "every accepted action ends exactly once, with what it printed",
                self.tally.failures.is_empty(),
            ),
            ("nothing left behind", self.leftovers.is_empty()),
            ("no call answered INTERNAL", self.tally.internal.is_empty()),
            (
                "runtime RSS at the end within 10 % of after warm-up",
                rss_ok,
            ),
        ]
    }

    pub fn print(&self) {
        let actions: u64 = self.tally.ends.values().sum();
        println!("\nsoak summary");
        println!(
            "  duration {} s, seed {}, clients {}",
            self.duration_s, self.seed, self.clients
        );
        println!(
            "  actions ended: {actions}, bytes checked: {}",
            self.tally.bytes
        );
        for (k, v) in &self.tally.ends {
            println!("    {k:<40} {v:>8}");
        }
        println!("  faults injected:");
        for (k, v) in &self.faults {
            println!("    {k:<40} {v:>8}");
        }
        println!("  reconnects and retries:");
        for (k, v) in &self.tally.reconnects {
            println!("    {k:<40} {v:>8}");
            if let Some(sample) = self.tally.samples.get(k) {
                println!("      e.g. {sample}");
            }
        }
        println!(
            "  runtime RSS (medians): {} KiB after warm-up (60-75 %), {} KiB at the end (85-100 %)",
            self.rss_baseline_kib, self.rss_end_kib
        );
        println!("  leftovers: {:?}", self.leftovers);
        for f in self.tally.failures.iter().take(20) {
            println!("  BROKEN: {f}");
        }
        for f in self.tally.internal.iter().take(20) {
            println!("  INTERNAL: {f}");
        }
        println!("  invariants:");
        for (name, ok) in self.invariants() {
            println!("    {:<4} {name}", if ok { "PASS" } else { "FAIL" });
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "duration_s": self.duration_s,
            "seed": self.seed,
            "clients": self.clients,
            "ends": self.tally.ends,
            "faults": self.faults,
            "reconnects": self.tally.reconnects,
            "samples": self.tally.samples,
            "bytes_checked": self.tally.bytes,
            "rss_baseline_kib": self.rss_baseline_kib,
            "rss_end_kib": self.rss_end_kib,
            "leftovers": self.leftovers,
            "failures": self.tally.failures,
            "internal": self.tally.internal,
            "invariants": self.invariants().into_iter().map(|(n, ok)| serde_json::json!({"name": n, "pass": ok})).collect::<Vec<_>>(),
        })
    }
}
