//! Model-based test: random sequences of store operations give the same
//! observable results from the store as from a plain in-memory model of the
//! spec, on SQLite and on PostgreSQL.
//!
//! The model is written from the spec alone and shares no code with the
//! store beyond the state names.

use std::marker::PhantomData;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};
use serde_json::json;
use surety_core::{AttemptState, IdempotencyKey, JobState};
use surety_store::{
    AttemptHandle, Created, Finish, JobId, NewJob, Outcome, OwnerId, Slot, StartAttempt, Store,
    StoreError,
};
use surety_tests::{Engine, TestDb};

const ROUTES: [&str; 2] = ["triage", "detect"];
const LEASE: Duration = Duration::from_secs(600);

/// An operation. Jobs and attempts are chosen by index into what exists;
/// an index past the end names a job or attempt that does not exist.
#[derive(Debug, Clone)]
pub enum Op {
    Create {
        owner: u8,
        key: u8,
        route: u8,
        input: u8,
    },
    Start {
        job: usize,
        hedge: bool,
    },
    Succeed {
        job: usize,
        attempt: usize,
        value: u8,
    },
    Fail {
        job: usize,
        attempt: usize,
        give_up: bool,
    },
    MarkUnknown {
        job: usize,
        attempt: usize,
    },
    Cancel {
        job: usize,
        attempt: usize,
    },
    Heartbeat {
        job: usize,
        attempt: usize,
    },
    /// Rewind the attempt's lease (as a dead router would leave it), then reap.
    ExpireAndReap {
        job: usize,
        attempt: usize,
    },
    Read {
        job: usize,
        as_other_owner: bool,
    },
}

/// What an operation showed its caller.
#[derive(Debug, Clone, PartialEq)]
pub enum Obs {
    None,
    New,
    Replayed,
    Conflict,
    Started(i64),
    AttemptOpen(i64),
    HedgeRefused,
    JobNotFound,
    AttemptNotFound,
    Refused(String),
    Won(Option<u8>),
    Lost(Option<i64>),
    Failed,
    Done,
    Reaped(Vec<(usize, i64)>),
    Job {
        state: JobState,
        version: i64,
        completed_by: Option<i64>,
        result: Option<u8>,
        attempts: Vec<AttemptState>,
    },
}

#[derive(Debug, Clone)]
pub struct MJob {
    owner: u8,
    key: u8,
    route: u8,
    input: u8,
    state: JobState,
    version: i64,
    completed_by: Option<i64>,
    result: Option<u8>,
    attempts: Vec<MAttempt>,
}

#[derive(Debug, Clone)]
pub struct MAttempt {
    hedge: bool,
    state: AttemptState,
}

#[derive(Debug, Clone, Default)]
pub struct Model {
    jobs: Vec<MJob>,
    last: Option<Obs>,
}

fn is_open(state: AttemptState) -> bool {
    matches!(state, AttemptState::Started | AttemptState::Unknown)
}

impl MJob {
    fn is_over(&self) -> bool {
        matches!(self.state, JobState::Succeeded | JobState::Cancelled)
    }

    /// The spec: a job that is not over is running while an attempt is
    /// started, unknown while one is unknown, and otherwise idle.
    fn settle(&mut self, idle: JobState) {
        if self.is_over() {
            return;
        }
        let any = |s| self.attempts.iter().any(|a| a.state == s);
        self.state = if any(AttemptState::Started) {
            JobState::Running
        } else if any(AttemptState::Unknown) {
            JobState::Unknown
        } else {
            idle
        };
    }

    fn view(&self) -> Obs {
        Obs::Job {
            state: self.state,
            version: self.version,
            completed_by: self.completed_by,
            result: self.result,
            attempts: self.attempts.iter().map(|a| a.state).collect(),
        }
    }
}

fn refused(what: &str, from: impl std::fmt::Display, event: &str) -> Obs {
    Obs::Refused(format!("{what} is {from}; it cannot {event}"))
}

impl Model {
    /// Applies an operation to an attempt, after the checks every such
    /// operation shares: the job and the attempt must exist.
    fn on_attempt(
        &mut self,
        job: usize,
        attempt: usize,
        op: impl FnOnce(&mut MJob, usize) -> Obs,
    ) -> Obs {
        let Some(j) = self.jobs.get_mut(job) else {
            return Obs::JobNotFound;
        };
        if attempt >= j.attempts.len() {
            return Obs::AttemptNotFound;
        }
        op(j, attempt)
    }

    fn step(&mut self, op: &Op) -> Obs {
        match *op {
            Op::Create {
                owner,
                key,
                route,
                input,
            } => match self.jobs.iter().find(|j| j.owner == owner && j.key == key) {
                Some(j) if j.route == route && j.input == input => Obs::Replayed,
                Some(_) => Obs::Conflict,
                None => {
                    self.jobs.push(MJob {
                        owner,
                        key,
                        route,
                        input,
                        state: JobState::Queued,
                        version: 0,
                        completed_by: None,
                        result: None,
                        attempts: Vec::new(),
                    });
                    Obs::New
                }
            },
            Op::Start { job, hedge } => {
                let Some(j) = self.jobs.get_mut(job) else {
                    return Obs::JobNotFound;
                };
                if j.is_over() {
                    return refused("job", j.state, "start an attempt");
                }
                let open_in = |j: &MJob, hedge: bool| {
                    j.attempts
                        .iter()
                        .position(|a| a.hedge == hedge && is_open(a.state))
                        .map(|i| i as i64 + 1)
                };
                if hedge && (ROUTES[j.route as usize] != "detect" || open_in(j, false).is_none()) {
                    return Obs::HedgeRefused;
                }
                if let Some(ordinal) = open_in(j, hedge) {
                    return Obs::AttemptOpen(ordinal);
                }
                j.attempts.push(MAttempt {
                    hedge,
                    state: AttemptState::Started,
                });
                j.state = JobState::Running;
                Obs::Started(j.attempts.len() as i64)
            }
            Op::Succeed {
                job,
                attempt,
                value,
            } => self.on_attempt(job, attempt, |j, a| {
                let state = j.attempts[a].state;
                if is_open(state) && j.completed_by.is_none() {
                    j.attempts[a].state = AttemptState::Succeeded;
                    j.state = JobState::Succeeded;
                    j.version += 1;
                    j.completed_by = Some(a as i64 + 1);
                    j.result = Some(value);
                    return Obs::Won(Some(value));
                }
                if is_open(state) {
                    j.attempts[a].state = AttemptState::Lost;
                } else if state != AttemptState::Cancelled {
                    return refused("attempt", state, "record a result");
                }
                j.settle(JobState::Queued);
                Obs::Lost(j.completed_by)
            }),
            Op::Fail {
                job,
                attempt,
                give_up,
            } => self.on_attempt(job, attempt, |j, a| {
                let state = j.attempts[a].state;
                if !is_open(state) {
                    return refused("attempt", state, "record a failure");
                }
                j.attempts[a].state = AttemptState::Failed;
                j.settle(if give_up {
                    JobState::Failed
                } else {
                    JobState::Queued
                });
                Obs::Failed
            }),
            Op::MarkUnknown { job, attempt } => self.on_attempt(job, attempt, |j, a| {
                let state = j.attempts[a].state;
                if state != AttemptState::Started {
                    return refused("attempt", state, "become unknown");
                }
                j.attempts[a].state = AttemptState::Unknown;
                j.settle(JobState::Queued);
                Obs::Done
            }),
            Op::Cancel { job, attempt } => self.on_attempt(job, attempt, |j, a| {
                let state = j.attempts[a].state;
                if !is_open(state) {
                    return refused("attempt", state, "be cancelled");
                }
                j.attempts[a].state = AttemptState::Cancelled;
                j.settle(JobState::Queued);
                Obs::Done
            }),
            Op::Heartbeat { job, attempt } => match self.on_attempt(job, attempt, |j, a| {
                let state = j.attempts[a].state;
                if state != AttemptState::Started {
                    return refused("attempt", state, "renew its lease");
                }
                Obs::Done
            }) {
                // A heartbeat names its attempt only; a missing job is a missing attempt.
                Obs::JobNotFound => Obs::AttemptNotFound,
                other => other,
            },
            Op::ExpireAndReap { job, attempt } => {
                let Some(j) = self.jobs.get_mut(job) else {
                    return Obs::None;
                };
                match j.attempts.get_mut(attempt) {
                    Some(a) if a.state == AttemptState::Started => {
                        a.state = AttemptState::Unknown;
                        j.settle(JobState::Queued);
                        Obs::Reaped(vec![(job, attempt as i64 + 1)])
                    }
                    _ => Obs::None,
                }
            }
            Op::Read {
                job,
                as_other_owner,
            } => match self.jobs.get(job) {
                Some(_) if as_other_owner => Obs::JobNotFound,
                Some(j) => j.view(),
                None => Obs::JobNotFound,
            },
        }
    }
}

pub struct StoreModel;

impl ReferenceStateMachine for StoreModel {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model::default()).boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Op> {
        // Indexes reach one past the end, to name what does not exist.
        let jobs = state.jobs.len() + 1;
        let attempts = state
            .jobs
            .iter()
            .map(|j| j.attempts.len())
            .max()
            .unwrap_or(0)
            + 1;
        let target = (0..jobs, 0..attempts);
        prop_oneof![
            3 => (0u8..2, 0u8..3, 0u8..2, 0u8..2)
                .prop_map(|(owner, key, route, input)| Op::Create { owner, key, route, input }),
            4 => (0..jobs, any::<bool>()).prop_map(|(job, hedge)| Op::Start { job, hedge }),
            3 => (target.clone(), 0u8..4).prop_map(|((job, attempt), value)| Op::Succeed { job, attempt, value }),
            2 => (target.clone(), any::<bool>()).prop_map(|((job, attempt), give_up)| Op::Fail { job, attempt, give_up }),
            2 => target.clone().prop_map(|(job, attempt)| Op::MarkUnknown { job, attempt }),
            2 => target.clone().prop_map(|(job, attempt)| Op::Cancel { job, attempt }),
            1 => target.clone().prop_map(|(job, attempt)| Op::Heartbeat { job, attempt }),
            1 => target.prop_map(|(job, attempt)| Op::ExpireAndReap { job, attempt }),
            2 => (0..jobs, any::<bool>()).prop_map(|(job, as_other_owner)| Op::Read { job, as_other_owner }),
        ]
        .boxed()
    }

    fn apply(mut state: Model, op: &Op) -> Model {
        let obs = state.step(op);
        state.last = Some(obs);
        state
    }
}

/// Which engine a run of the model test uses.
pub trait EngineChoice {
    const ENGINE: Engine;
}

pub struct OnSqlite;
pub struct OnPostgres;

impl EngineChoice for OnSqlite {
    const ENGINE: Engine = Engine::Sqlite;
}

impl EngineChoice for OnPostgres {
    const ENGINE: Engine = Engine::Postgres;
}

pub struct StoreUnderTest<E>(PhantomData<E>);

pub struct Sut {
    runtime: tokio::runtime::Runtime,
    db: TestDb,
    store: Store,
    /// Per model job: its id and owner.
    jobs: Vec<(JobId, OwnerId)>,
    /// Per model job: the handles of its attempts, in order.
    handles: Vec<Vec<AttemptHandle>>,
}

fn owner(n: u8) -> OwnerId {
    OwnerId(format!("owner-{n}"))
}

impl Sut {
    fn job(&self, job: usize) -> (JobId, OwnerId) {
        self.jobs.get(job).cloned().unwrap_or_else(|| {
            (
                JobId("00000000-0000-7000-8000-000000000000".into()),
                owner(0),
            )
        })
    }

    fn handle(&self, job: usize, attempt: usize) -> AttemptHandle {
        let found = self.handles.get(job).and_then(|h| h.get(attempt)).cloned();
        found.unwrap_or_else(|| AttemptHandle {
            job_id: self.job(job).0,
            ordinal: attempt as i64 + 1,
            slot: Slot::Primary,
            provider: "p".into(),
            base_version: 0,
            charged: true,
        })
    }

    fn observe_err(e: StoreError) -> Obs {
        match e {
            StoreError::JobNotFound(_) => Obs::JobNotFound,
            StoreError::AttemptNotFound { .. } => Obs::AttemptNotFound,
            StoreError::AttemptOpen { ordinal, .. } => Obs::AttemptOpen(ordinal),
            StoreError::HedgeRefused { .. } => Obs::HedgeRefused,
            StoreError::Transition(t) => Obs::Refused(t.to_string()),
            other => panic!("unexpected store error: {other}"),
        }
    }

    fn finish(&self, job: usize, attempt: usize, outcome: Outcome) -> Obs {
        let handle = self.handle(job, attempt);
        match self
            .runtime
            .block_on(self.store.finish_attempt(&handle, outcome))
        {
            Ok(Finish::Won(j)) => Obs::Won(j.result.and_then(|r| r["v"].as_u64()).map(|v| v as u8)),
            Ok(Finish::Lost { winner }) => Obs::Lost(winner),
            Ok(Finish::Failed) => Obs::Failed,
            Err(e) => Sut::observe_err(e),
        }
    }

    fn step(&mut self, op: &Op) -> Obs {
        let done = |r: Result<(), StoreError>| r.map_or_else(Sut::observe_err, |()| Obs::Done);
        match *op {
            Op::Create {
                owner: o,
                key,
                route,
                input,
            } => {
                let new = NewJob {
                    owner: owner(o),
                    key: IdempotencyKey::parse(&format!("key-{key}")).unwrap(),
                    route: ROUTES[route as usize].to_owned(),
                    contract: ROUTES[route as usize].to_owned(),
                    contract_digest: "d".into(),
                    input: json!({ "input": input }),
                    hedgeable: ROUTES[route as usize] == "detect",
                    kind: surety_store::JobKind::Native,
                    messages: None,
                    request: None,
                    fingerprint: None,
                };
                match self
                    .runtime
                    .block_on(self.store.create_or_replay(&new))
                    .unwrap()
                {
                    Created::New(job) => {
                        self.jobs.push((job.id, job.owner));
                        self.handles.push(Vec::new());
                        Obs::New
                    }
                    Created::Replayed(_) => Obs::Replayed,
                    Created::Conflict => Obs::Conflict,
                }
            }
            Op::Start { job, hedge } => {
                let (id, owner) = self.job(job);
                let slot = if hedge { Slot::Hedge } else { Slot::Primary };
                let start = StartAttempt {
                    provider: "p".into(),
                    slot,
                    lease: LEASE,
                    trust: None,
                    charges: Vec::new(),
                };
                match self
                    .runtime
                    .block_on(self.store.start_attempt(&owner, &id, &start))
                {
                    Ok(handle) => {
                        let ordinal = handle.ordinal;
                        self.handles[job].push(handle);
                        Obs::Started(ordinal)
                    }
                    Err(e) => Sut::observe_err(e),
                }
            }
            Op::Succeed {
                job,
                attempt,
                value,
            } => self.finish(
                job,
                attempt,
                Outcome::Succeeded(json!({ "v": value }).into()),
            ),
            Op::Fail {
                job,
                attempt,
                give_up,
            } => self.finish(
                job,
                attempt,
                Outcome::Failed {
                    spend: surety_store::Spend::Nothing,
                    error: "HTTP 400".into(),
                    give_up,
                },
            ),
            Op::MarkUnknown { job, attempt } => done(
                self.runtime.block_on(
                    self.store
                        .mark_unknown(&self.handle(job, attempt), "timed out"),
                ),
            ),
            Op::Cancel { job, attempt } => {
                let (id, owner) = self.job(job);
                done(
                    self.runtime.block_on(self.store.cancel_attempt(
                        &owner,
                        &id,
                        attempt as i64 + 1,
                        "admin",
                    )),
                )
            }
            Op::Heartbeat { job, attempt } => done(
                self.runtime
                    .block_on(self.store.heartbeat(&self.handle(job, attempt), LEASE)),
            ),
            Op::ExpireAndReap { job, attempt } => {
                let (id, _) = self.job(job);
                self.runtime.block_on(self.db.exec(&format!(
                    "UPDATE attempts SET lease_expires_at_ms = lease_expires_at_ms - 3600000 \
                     WHERE job_id = '{}' AND ordinal = {} AND state = 'started'",
                    id.0,
                    attempt + 1
                )));
                let reaped = self.runtime.block_on(self.store.reap_expired()).unwrap();
                let reaped: Vec<_> = reaped
                    .into_iter()
                    .map(|r| {
                        (
                            self.jobs
                                .iter()
                                .position(|(id, _)| *id == r.job_id)
                                .unwrap(),
                            r.ordinal,
                        )
                    })
                    .collect();
                if reaped.is_empty() {
                    Obs::None
                } else {
                    Obs::Reaped(reaped)
                }
            }
            Op::Read {
                job,
                as_other_owner,
            } => {
                let (id, owner) = self.job(job);
                let reader = if as_other_owner {
                    OwnerId(format!("{}-other", owner.0))
                } else {
                    owner
                };
                let read = self.runtime.block_on(async {
                    let j = self.store.job(&reader, &id).await?;
                    let attempts = self.store.attempts(&reader, &id).await?;
                    Ok::<_, StoreError>((j, attempts))
                });
                match read {
                    Ok((j, attempts)) => Obs::Job {
                        state: j.state,
                        version: j.version,
                        completed_by: j.completed_by,
                        result: j.result.and_then(|r| r["v"].as_u64()).map(|v| v as u8),
                        attempts: attempts.iter().map(|a| a.state).collect(),
                    },
                    Err(e) => Sut::observe_err(e),
                }
            }
        }
    }
}

impl<E: EngineChoice> StateMachineTest for StoreUnderTest<E> {
    /// `None` when PostgreSQL is unreachable outside CI.
    type SystemUnderTest = Option<Sut>;
    type Reference = StoreModel;

    fn init_test(_: &Model) -> Option<Sut> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let db = runtime.block_on(TestDb::new(E::ENGINE))?;
        let store = runtime.block_on(db.store());
        Some(Sut {
            runtime,
            db,
            store,
            jobs: Vec::new(),
            handles: Vec::new(),
        })
    }

    fn apply(sut: Option<Sut>, model: &Model, op: Op) -> Option<Sut> {
        let mut sut = sut?;
        let seen = sut.step(&op);
        assert_eq!(
            Some(&seen),
            model.last.as_ref(),
            "store and model disagree on {op:?}"
        );
        Some(sut)
    }

    fn check_invariants(sut: &Option<Sut>, model: &Model) {
        let Some(sut) = sut else { return };
        // The database's own view of every job agrees with the model's.
        for (i, j) in model.jobs.iter().enumerate() {
            let (id, owner) = sut.job(i);
            let stored = sut.runtime.block_on(sut.store.job(&owner, &id)).unwrap();
            assert_eq!(
                (stored.state, stored.version, stored.completed_by),
                (j.state, j.version, j.completed_by)
            );
        }
    }

    fn teardown(sut: Option<Sut>, _: Model) {
        if let Some(sut) = sut {
            sut.runtime.block_on(sut.store.close());
            // The database is dropped (and its schema with it) before the runtime.
            drop(sut.db);
        }
    }
}

prop_state_machine! {
    #![proptest_config(Config { cases: 48, max_shrink_iters: 2000, failure_persistence: None, ..Config::default() })]

    #[test]
    fn store_matches_the_model_on_sqlite(sequential 1..40 => StoreUnderTest<OnSqlite>);

    #[test]
    fn store_matches_the_model_on_postgres(sequential 1..40 => StoreUnderTest<OnPostgres>);
}
