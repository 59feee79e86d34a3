//! A contract's `[live]` section: what the router's own checks compare
//! (the agreement pointers: the fields two interchangeable providers must
//! agree on) and the thresholds past which a provider is demoted for the
//! contract. The verdict is computed here, from the results alone, with no
//! IO: the router records the results and acts on the verdict.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `[live]` as the contract states it (every field has a default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Live {
    /// JSON pointers into the answer on which a fallback must agree with
    /// the job's answer (e.g. `/language`).
    pub agreement: Vec<String>,
    /// The newest live results judged, per provider.
    pub window: u32,
    /// Broken answers tolerated in the window; one more demotes.
    pub max_broken: u32,
    /// The least share of agreeing answers among those that kept the
    /// contract, once `min_judged` of them are in the window.
    pub min_agreement: f64,
    /// Answers that kept the contract before the share of agreement counts.
    pub min_judged: u32,
    /// A scheduled re-check that breaks a case demotes at once.
    pub recheck_must_pass: bool,
    /// A provider that did not answer (an error or a timeout) counts as
    /// broken; by default it does not, and a timeout never demotes by itself.
    pub failures_demote: bool,
}

impl Default for Live {
    fn default() -> Live {
        Live {
            agreement: Vec::new(),
            window: 50,
            max_broken: 0,
            min_agreement: 0.95,
            min_judged: 10,
            recheck_must_pass: true,
            failures_demote: false,
        }
    }
}

/// A live result as the thresholds read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Kept,
    Broke,
    Disagreed,
    Failed,
}

/// One live result: what was seen, whether it came from a scheduled
/// re-check (else a shadow call on real traffic), and what was found.
#[derive(Debug, Clone, Copy)]
pub struct Judged<'a> {
    pub seen: Seen,
    pub recheck: bool,
    pub detail: &'a str,
}

impl Live {
    /// Checks the section: pointers that are pointers, thresholds that can be met.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(bad) = self.agreement.iter().find(|p| !p.starts_with('/')) {
            return Err(format!(
                "`live.agreement`: `{bad}` is not a JSON pointer (it starts with `/`)"
            ));
        }
        if self.window == 0 {
            return Err("`live.window` must be at least 1".to_owned());
        }
        if !(0.0..=1.0).contains(&self.min_agreement) {
            return Err("`live.min_agreement` is a share, from 0 to 1".to_owned());
        }
        Ok(())
    }

    /// Where `answer` differs from `expected` on the agreement pointers, in
    /// words (`/language: "german", the job's is "english"`); `None` when they agree.
    pub fn disagreement(&self, expected: &Value, answer: &Value) -> Option<String> {
        let differing: Vec<String> = self
            .agreement
            .iter()
            .filter_map(|p| {
                let (theirs, ours) = (answer.pointer(p), expected.pointer(p));
                (theirs != ours).then(|| {
                    let shown =
                        |v: Option<&Value>| v.map_or("nothing".to_owned(), Value::to_string);
                    format!("{p}: {}, the job's is {}", shown(theirs), shown(ours))
                })
            })
            .collect();
        (!differing.is_empty()).then(|| differing.join("; "))
    }

    /// The job's answer on the agreement pointers, as `{pointer: value}`.
    pub fn agreed_fields(&self, answer: &Value) -> Value {
        Value::Object(
            self.agreement
                .iter()
                .map(|p| (p.clone(), answer.pointer(p).cloned().unwrap_or(Value::Null)))
                .collect(),
        )
    }

    /// Why a provider must be demoted, given its newest results (newest
    /// first; only the newest `window` count), in words; `None` while it
    /// keeps the contract within the thresholds.
    pub fn demotion(&self, newest_first: &[Judged<'_>]) -> Option<String> {
        let window = &newest_first[..newest_first.len().min(self.window as usize)];
        let n = window.len();
        if self.recheck_must_pass
            && let Some(broken) = window.iter().find(|r| r.recheck && r.seen == Seen::Broke)
        {
            return Some(format!(
                "demoted: a scheduled re-check of a certification case broke the contract — {}",
                broken.detail
            ));
        }
        let broke = |r: &&Judged<'_>| {
            r.seen == Seen::Broke || (self.failures_demote && r.seen == Seen::Failed)
        };
        let broken: Vec<&Judged<'_>> = window.iter().filter(broke).collect();
        if broken.len() > self.max_broken as usize {
            return Some(format!(
                "demoted: {} of the last {n} live checks broke the contract — {}",
                broken.len(),
                broken[0].detail
            ));
        }
        let kept = window.iter().filter(|r| r.seen == Seen::Kept).count();
        let disagreed: Vec<&Judged<'_>> = window
            .iter()
            .filter(|r| r.seen == Seen::Disagreed)
            .collect();
        let judged = kept + disagreed.len();
        if judged >= self.min_judged as usize && judged > 0 {
            let share = kept as f64 / judged as f64;
            if share < self.min_agreement {
                return Some(format!(
                    "demoted: {} of the last {judged} answers that kept the contract disagreed with the job's answer (agreement {:.0} %, at least {:.0} % needed) — {}",
                    disagreed.len(),
                    share * 100.0,
                    self.min_agreement * 100.0,
                    disagreed.first().map_or("", |r| r.detail)
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn seen(kinds: &[Seen]) -> Vec<Judged<'static>> {
        kinds
            .iter()
            .map(|&seen| Judged {
                seen,
                recheck: false,
                detail: "what was found",
            })
            .collect()
    }

    #[test]
    fn one_broken_answer_past_the_tolerance_demotes_saying_how_many() {
        let live = Live {
            max_broken: 1,
            ..Live::default()
        };
        assert_eq!(
            live.demotion(&seen(&[Seen::Kept, Seen::Broke, Seen::Kept])),
            None
        );
        let why = live
            .demotion(&seen(&[Seen::Broke, Seen::Kept, Seen::Broke]))
            .unwrap();
        assert_eq!(
            why,
            "demoted: 2 of the last 3 live checks broke the contract — what was found"
        );
    }

    #[test]
    fn only_the_window_counts() {
        let live = Live {
            window: 2,
            ..Live::default()
        };
        assert_eq!(
            live.demotion(&seen(&[Seen::Kept, Seen::Kept, Seen::Broke])),
            None
        );
    }

    #[test]
    fn failures_count_only_when_the_contract_says_so() {
        let failed = seen(&[Seen::Failed, Seen::Failed]);
        assert_eq!(Live::default().demotion(&failed), None);
        let strict = Live {
            failures_demote: true,
            ..Live::default()
        };
        assert!(strict.demotion(&failed).is_some());
    }

    #[test]
    fn disagreement_counts_once_enough_answers_are_judged() {
        let live = Live {
            min_judged: 4,
            min_agreement: 0.75,
            ..Live::default()
        };
        let three = seen(&[Seen::Disagreed, Seen::Kept, Seen::Kept]);
        assert_eq!(live.demotion(&three), None, "too few judged yet");
        let four = seen(&[Seen::Disagreed, Seen::Disagreed, Seen::Kept, Seen::Kept]);
        let why = live.demotion(&four).unwrap();
        assert!(
            why.contains("2 of the last 4 answers that kept the contract disagreed"),
            "{why}"
        );
        let fine = seen(&[Seen::Disagreed, Seen::Kept, Seen::Kept, Seen::Kept]);
        assert_eq!(live.demotion(&fine), None, "75 % agree");
    }

    #[test]
    fn a_broken_recheck_demotes_at_once() {
        let live = Live {
            max_broken: 5,
            ..Live::default()
        };
        let results = [Judged {
            seen: Seen::Broke,
            recheck: true,
            detail: "case `german`: fact at /language",
        }];
        let why = live.demotion(&results).unwrap();
        assert!(
            why.contains("scheduled re-check") && why.contains("case `german`"),
            "{why}"
        );
        let lenient = Live {
            recheck_must_pass: false,
            ..live
        };
        assert_eq!(lenient.demotion(&results), None);
    }

    #[test]
    fn disagreement_is_read_on_the_pointers_only() {
        let live = Live {
            agreement: vec!["/category".into(), "/priority".into()],
            ..Live::default()
        };
        let job = json!({"category": "billing", "priority": "high", "summary": "a"});
        let same = json!({"category": "billing", "priority": "high", "summary": "b"});
        assert_eq!(live.disagreement(&job, &same), None);
        let other = json!({"category": "bug", "priority": "high", "summary": "a"});
        assert_eq!(
            live.disagreement(&job, &other).unwrap(),
            "/category: \"bug\", the job's is \"billing\""
        );
        assert_eq!(
            live.agreed_fields(&job),
            json!({"/category": "billing", "/priority": "high"})
        );
    }

    #[test]
    fn a_section_that_cannot_work_is_refused() {
        assert!(
            Live {
                agreement: vec!["language".into()],
                ..Live::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            Live {
                window: 0,
                ..Live::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            Live {
                min_agreement: 1.5,
                ..Live::default()
            }
            .validate()
            .is_err()
        );
        assert!(Live::default().validate().is_ok());
    }
}
