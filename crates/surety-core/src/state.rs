//! Job and attempt states, and their transitions as pure functions.
//!
//! The store enforces these rules in the database (constraints and guarded
//! single statements); these functions say what the rules are and explain a
//! refusal with a typed error.

use std::fmt;

/// What the owner asked for, as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// No attempt is open and the job is not over: the next attempt may start.
    Queued,
    /// At least one attempt is `started`.
    Running,
    /// No attempt is `started` and at least one is `unknown`: a provider may
    /// still be working, and may still bill.
    Unknown,
    /// An attempt won the compare-and-swap; the job holds its result.
    Succeeded,
    /// Every attempt failed definitely and the router gave up. A retry may
    /// start a new attempt.
    Failed,
    /// The whole job was cancelled.
    Cancelled,
}

/// One try at one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptState {
    Started,
    Succeeded,
    Failed,
    /// Timed out after the request left, or its lease expired: the provider
    /// may have done the work.
    Unknown,
    /// Finished after another attempt had won; its payload was discarded.
    Lost,
    /// Resolved out of band by an admin; it can never finish.
    Cancelled,
}

/// Job-level events. Attempt-level changes do not go through here: the job's
/// state then follows from its attempts (see [`JobState::from_open_attempts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEvent {
    AttemptStarted,
    Completed,
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEvent {
    /// The attempt's result won the compare-and-swap.
    Won,
    /// The provider refused definitely (4xx, 429, a contract violation, ...).
    Failed,
    /// The attempt timed out after the request left, or its lease expired.
    TimedOut,
    /// The attempt finished after the job was completed by another.
    LostRace,
    /// An admin resolved the attempt out of band.
    Cancelled,
    /// The attempt's lease was renewed.
    Heartbeat,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("job is {from}; it cannot {event}")]
    Job { from: JobState, event: JobEvent },
    #[error("attempt is {from}; it cannot {event}")]
    Attempt {
        from: AttemptState,
        event: AttemptEvent,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a known state")]
pub struct ParseStateError(pub String);

impl JobState {
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Running,
        JobState::Unknown,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Unknown => "unknown",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Result<JobState, ParseStateError> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| ParseStateError(s.to_owned()))
    }

    /// Nothing more will happen to the job on its own: a client waiting for
    /// an answer can stop waiting.
    pub fn is_settled(self) -> bool {
        match self {
            JobState::Succeeded | JobState::Failed | JobState::Cancelled => true,
            JobState::Queued | JobState::Running | JobState::Unknown => false,
        }
    }

    /// No event moves the job out of this state.
    pub fn is_final(self) -> bool {
        match self {
            JobState::Succeeded | JobState::Cancelled => true,
            JobState::Queued | JobState::Running | JobState::Unknown | JobState::Failed => false,
        }
    }

    /// The state of a job that is not final, from its open attempts.
    /// `idle` is the state when no attempt is open (`Queued` while more
    /// attempts are to come, `Failed` once the router gave up).
    pub fn from_open_attempts(any_started: bool, any_unknown: bool, idle: JobState) -> JobState {
        match (any_started, any_unknown) {
            (true, _) => JobState::Running,
            (false, true) => JobState::Unknown,
            (false, false) => idle,
        }
    }
}

impl AttemptState {
    pub const ALL: [AttemptState; 6] = [
        AttemptState::Started,
        AttemptState::Succeeded,
        AttemptState::Failed,
        AttemptState::Unknown,
        AttemptState::Lost,
        AttemptState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AttemptState::Started => "started",
            AttemptState::Succeeded => "succeeded",
            AttemptState::Failed => "failed",
            AttemptState::Unknown => "unknown",
            AttemptState::Lost => "lost",
            AttemptState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Result<AttemptState, ParseStateError> {
        AttemptState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| ParseStateError(s.to_owned()))
    }

    /// An open attempt may still produce a result, and blocks new attempts.
    pub fn is_open(self) -> bool {
        match self {
            AttemptState::Started | AttemptState::Unknown => true,
            AttemptState::Succeeded
            | AttemptState::Failed
            | AttemptState::Lost
            | AttemptState::Cancelled => false,
        }
    }
}

/// The job's state after a job-level event.
pub fn job_after(from: JobState, event: JobEvent) -> Result<JobState, TransitionError> {
    if from.is_final() {
        return Err(TransitionError::Job { from, event });
    }
    Ok(match event {
        JobEvent::AttemptStarted => JobState::Running,
        JobEvent::Completed => JobState::Succeeded,
        JobEvent::Cancelled => JobState::Cancelled,
    })
}

/// The attempt's state after an event.
pub fn attempt_after(
    from: AttemptState,
    event: AttemptEvent,
) -> Result<AttemptState, TransitionError> {
    let refused = Err(TransitionError::Attempt { from, event });
    match (from, event) {
        (AttemptState::Started | AttemptState::Unknown, AttemptEvent::Won) => {
            Ok(AttemptState::Succeeded)
        }
        (AttemptState::Started | AttemptState::Unknown, AttemptEvent::Failed) => {
            Ok(AttemptState::Failed)
        }
        (AttemptState::Started | AttemptState::Unknown, AttemptEvent::LostRace) => {
            Ok(AttemptState::Lost)
        }
        (AttemptState::Started | AttemptState::Unknown, AttemptEvent::Cancelled) => {
            Ok(AttemptState::Cancelled)
        }
        (AttemptState::Started, AttemptEvent::TimedOut) => Ok(AttemptState::Unknown),
        (AttemptState::Started, AttemptEvent::Heartbeat) => Ok(AttemptState::Started),
        (AttemptState::Unknown, AttemptEvent::TimedOut | AttemptEvent::Heartbeat) => refused,
        (
            AttemptState::Succeeded
            | AttemptState::Failed
            | AttemptState::Lost
            | AttemptState::Cancelled,
            _,
        ) => refused,
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for AttemptState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for JobEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JobEvent::AttemptStarted => "start an attempt",
            JobEvent::Completed => "be completed",
            JobEvent::Cancelled => "be cancelled",
        })
    }
}

impl fmt::Display for AttemptEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttemptEvent::Won => "record a result",
            AttemptEvent::Failed => "record a failure",
            AttemptEvent::TimedOut => "become unknown",
            AttemptEvent::LostRace => "lose a race",
            AttemptEvent::Cancelled => "be cancelled",
            AttemptEvent::Heartbeat => "renew its lease",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_names() {
        for state in JobState::ALL {
            assert_eq!(JobState::parse(state.as_str()), Ok(state));
        }
        for state in AttemptState::ALL {
            assert_eq!(AttemptState::parse(state.as_str()), Ok(state));
        }
        assert_eq!(
            JobState::parse("done"),
            Err(ParseStateError("done".to_owned()))
        );
    }

    #[test]
    fn a_timeout_is_unknown_never_failed() {
        assert_eq!(
            attempt_after(AttemptState::Started, AttemptEvent::TimedOut),
            Ok(AttemptState::Unknown)
        );
        assert_eq!(
            JobState::from_open_attempts(false, true, JobState::Queued),
            JobState::Unknown
        );
    }

    #[test]
    fn an_unknown_attempt_leaves_only_by_result_or_cancel() {
        assert_eq!(
            attempt_after(AttemptState::Unknown, AttemptEvent::Won),
            Ok(AttemptState::Succeeded)
        );
        assert_eq!(
            attempt_after(AttemptState::Unknown, AttemptEvent::Cancelled),
            Ok(AttemptState::Cancelled)
        );
        let err = attempt_after(AttemptState::Unknown, AttemptEvent::Heartbeat).unwrap_err();
        assert_eq!(
            err.to_string(),
            "attempt is unknown; it cannot renew its lease"
        );
    }

    #[test]
    fn terminal_states_refuse_every_event() {
        let events = [
            AttemptEvent::Won,
            AttemptEvent::Failed,
            AttemptEvent::TimedOut,
            AttemptEvent::LostRace,
            AttemptEvent::Cancelled,
            AttemptEvent::Heartbeat,
        ];
        for from in AttemptState::ALL.into_iter().filter(|s| !s.is_open()) {
            for event in events {
                assert_eq!(
                    attempt_after(from, event),
                    Err(TransitionError::Attempt { from, event })
                );
            }
        }
        for from in [JobState::Succeeded, JobState::Cancelled] {
            for event in [
                JobEvent::AttemptStarted,
                JobEvent::Completed,
                JobEvent::Cancelled,
            ] {
                assert_eq!(
                    job_after(from, event),
                    Err(TransitionError::Job { from, event })
                );
            }
        }
        let err = job_after(JobState::Succeeded, JobEvent::AttemptStarted).unwrap_err();
        assert_eq!(
            err.to_string(),
            "job is succeeded; it cannot start an attempt"
        );
    }

    #[test]
    fn a_failed_job_may_be_retried() {
        assert_eq!(
            job_after(JobState::Failed, JobEvent::AttemptStarted),
            Ok(JobState::Running)
        );
    }
}
