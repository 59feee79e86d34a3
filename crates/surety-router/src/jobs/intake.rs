//! Taking a job: its route and contract, the providers certified for it
//! now, and create-or-replay in one commit, dispatched on the router's own
//! tasks.

use std::sync::Arc;

use serde_json::Value;
use surety_core::{Fingerprint, IdempotencyKey};
use surety_providers::Message;
use surety_store::{Created, Job, JobKind, NewJob, OwnerId, Slot, StartAttempt, StoreError};
use tracing::Instrument;

use super::JobError;
use crate::certification::{Eligible, ServedContract};
use crate::config::Route;
use crate::dispatch::{self, Drive};
use crate::settled::Waiter;
use crate::state::AppState;

/// A route and its contract, by the route's id.
pub fn route_and_contract<'s>(
    state: &'s AppState,
    id: &str,
) -> Result<(Route, &'s Arc<ServedContract>), JobError> {
    let route = state
        .inner
        .routes
        .get(id)
        .cloned()
        .ok_or_else(|| JobError::UnknownRoute(id.to_owned()))?;
    let contract = state
        .inner
        .contracts
        .get(&route.contract)
        .ok_or_else(|| JobError::internal("a route names a missing contract"))?;
    Ok((route, contract))
}

/// Which open demotions eligibility is judged with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demotions {
    /// As this router last read them, unless they list one of the
    /// contract's (which may have been lifted since): then read. A
    /// demotion made since is refused by the attempt's own insert.
    Seen,
    /// Read from the database now.
    Read,
}

/// The route's providers the manifest certifies for its contract now, in
/// order; never empty: with none, a 503 saying why each is not.
pub async fn certified(
    state: &AppState,
    route: &Route,
    served: &ServedContract,
    demotions: Demotions,
) -> Result<Vec<Eligible>, JobError> {
    let contract = &served.contract;
    let seen = state.inner.certifier_seen();
    let certifier = match demotions {
        Demotions::Seen if !seen.lists_demotions_of(&contract.id) => seen,
        Demotions::Seen | Demotions::Read => state.inner.certifier().await?,
    };
    let (eligible, why_not) = certifier.eligible(route, served);
    if eligible.is_empty() {
        return Err(JobError::NoCertifiedProvider {
            route: route.id.clone(),
            contract: contract.id.clone(),
            digest: contract.digest.clone(),
            why: why_not.join("; "),
        });
    }
    Ok(eligible)
}

/// A job as a create request found or made it.
pub struct CreatedJob {
    pub job: Job,
    pub replayed: bool,
    /// Registered before the job was dispatched, when asked for.
    pub waiter: Option<Waiter>,
}

/// What a create request asks for, checked: the job to record, the route
/// and its contract as served, and what the job's attempts send.
pub struct Intake {
    pub job: NewJob,
    pub route: Route,
    pub served: Arc<ServedContract>,
    /// What the job's attempts send (see [`Drive::messages`]).
    pub messages: Vec<Message>,
    /// The name of the API key that asked (`[[api_keys]] name`), whose
    /// budgets the job counts against beside its owner's.
    pub key_name: Option<String>,
}

impl Intake {
    /// A job of `route` for `owner`, asked for with the API key named
    /// `key_name`, under idempotency key `key`, of `input` asked for as
    /// `kind`, whose attempts send `messages`; its fingerprint is over the
    /// route and the input.
    pub fn new(
        (owner, key_name, key): (OwnerId, Option<String>, IdempotencyKey),
        (route, served): (Route, Arc<ServedContract>),
        input: Value,
        kind: JobKind,
        messages: Vec<Message>,
    ) -> Intake {
        let contract = &served.contract;
        let job = NewJob {
            owner,
            key,
            route: route.id.clone(),
            contract: contract.id.clone(),
            contract_digest: contract.digest.clone(),
            input,
            kind,
            messages: None,
            request: None,
            hedgeable: contract.hedgeable(),
            fingerprint: None,
        };
        Intake {
            job,
            route,
            served,
            messages,
            key_name,
        }
    }

    /// The fingerprint is `fingerprint` (over a whole chat request).
    pub fn fingerprinted(mut self, fingerprint: Fingerprint) -> Intake {
        self.job.fingerprint = Some(fingerprint);
        self
    }

    /// The request is kept with the job as sent (a Responses job's body:
    /// what its response object echoes, and the response it continues).
    pub fn requesting(mut self, request: Value) -> Intake {
        self.job.request = Some(request);
        self
    }

    /// The messages are the client's, not the contract's rendering of the
    /// input (an output-only chat route): they are kept with the job, for
    /// its retries.
    pub fn keeping_messages(mut self) -> Result<Intake, JobError> {
        self.job.messages = Some(serde_json::to_value(&self.messages).map_err(JobError::internal)?);
        Ok(self)
    }
}

/// Finds the job this owner's key already names (a replay, or a conflict),
/// whatever the manifest says now; or creates the job with its first
/// attempt at the first certified provider, in one commit. A new job is
/// dispatched at once, after the waiter (`watch`) is registered.
pub async fn create_or_replay(
    state: &AppState,
    intake: Intake,
    watch: bool,
) -> Result<CreatedJob, JobError> {
    // Once asked for, a job's creation and dispatch run on the router's own
    // task, whatever becomes of this request: a client that goes away
    // between the commit and the dispatch cannot strand a committed job.
    // The task answers this request as soon as the job is recorded, then
    // drives it.
    let (answer, created) = tokio::sync::oneshot::channel();
    let detached = state.clone();
    let job = async move {
        match create(&detached, intake, watch).await {
            Ok((job, drive)) => {
                let _ = answer.send(Ok(job));
                if let Some(drive) = drive {
                    dispatch::drive(&detached, drive).await;
                }
            }
            Err(e) => {
                let _ = answer.send(Err(e));
            }
        }
    }
    .in_current_span();
    // Boxed: the job's future (its creation and its whole dispatch) is
    // 14 KB, and a task's future inline in its cell is copied as it is
    // spawned and again as its stage is set at the end (`memcpy` under
    // `Cell::new` and `set_stage`: 1.5 % of the router's CPU at 64 clients).
    state.inner.tasks.spawn(Box::pin(job));
    created
        .await
        .map_err(|_| JobError::internal("the job's task ended before it answered"))?
}

/// The job the key names, or a new one recorded with its first attempt
/// and what drives it.
async fn create(
    state: &AppState,
    intake: Intake,
    watch: bool,
) -> Result<(CreatedJob, Option<Drive>), JobError> {
    let new = &intake.job;
    let conflict = |state: &AppState| {
        state.inner.metrics.conflicts.inc();
        JobError::Conflict
    };
    // The insert decides between a new job and a replay (`create_and_start`
    // answers a replay or a conflict without starting anything), so a new
    // job costs no read first. Only a new job needs a certified provider:
    // when none is, or eligibility cannot be read, the key is looked up
    // before refusing, so a replay is answered whatever the manifest says.
    // The first provider is chosen by the demotions as this router last
    // read them; the attempt's insert checks them in the database, and a
    // provider demoted since is refused there: then they are read and the
    // choice made again (each demotion read this way is one provider fewer).
    let mut demotions = Demotions::Seen;
    let (job, first, providers) = loop {
        let providers = match certified(state, &intake.route, &intake.served, demotions).await {
            Ok(providers) => providers,
            Err(refusal) => match state.inner.store.find(new).await? {
                Some(Created::Replayed(job)) => {
                    return Ok((replayed(state, job, watch), None));
                }
                Some(Created::Conflict) => return Err(conflict(state)),
                Some(Created::New(_)) | None => return Err(refusal),
            },
        };
        let at = providers
            .first()
            .ok_or_else(|| JobError::internal("no eligible provider"))?;
        let charges = state
            .inner
            .charges(
                &at.id,
                &intake.served,
                &intake.messages,
                (&new.owner.0, intake.key_name.as_deref()),
            )
            .await;
        let first = StartAttempt {
            provider: at.id.clone(),
            slot: Slot::Primary,
            lease: state.inner.settings.lease,
            trust: Some(at.trust(&intake.served.contract.id)),
            charges,
        };
        match state.inner.store.create_and_start(new, &first).await {
            Ok((Created::New(job), first)) => break (job, first, providers),
            Ok((Created::Replayed(job), _)) => return Ok((replayed(state, job, watch), None)),
            Ok((Created::Conflict, _)) => return Err(conflict(state)),
            Err(e @ StoreError::OverBudget { .. }) => {
                let refusal = state
                    .inner
                    .refused(&e, &new.owner.0, intake.key_name.as_deref());
                return Err(JobError::OverBudget(refusal));
            }
            Err(StoreError::Demoted { provider, .. }) => {
                tracing::info!(%provider, "the database refused a provider demoted since this router last read: reading again");
                demotions = Demotions::Read;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let waiter = watch.then(|| state.inner.settled.watch(&job.id));
    state
        .inner
        .metrics
        .jobs_created
        .with_label_values(&[new.route.as_str(), new.kind.as_str()])
        .inc();
    tracing::info!(job_id = %job.id, owner = %new.owner, route = %new.route, "job created");
    let drive = Drive {
        owner: intake.job.owner.clone(),
        job_id: job.id.clone(),
        route: intake.route,
        served: intake.served.clone(),
        messages: intake.messages,
        key_name: intake.key_name,
        anthropic_beta: super::anthropic_beta(intake.job.kind, intake.job.request.as_ref()),
        input: std::sync::Arc::new(intake.job.input),
        first,
        providers: providers.into(),
    };
    let created = CreatedJob {
        job,
        replayed: false,
        waiter,
    };
    Ok((created, Some(drive)))
}

/// The job a replayed key names, counted.
fn replayed(state: &AppState, job: Job, watch: bool) -> CreatedJob {
    state.inner.metrics.replays.inc();
    match watch {
        true => CreatedJob::watched(state, job),
        false => CreatedJob {
            job,
            replayed: true,
            waiter: None,
        },
    }
}

impl CreatedJob {
    /// A job read before, watched from now on: waiting for it
    /// ([`super::wait_at_rest`]) reads it again first, as it may have
    /// moved since.
    pub fn watched(state: &AppState, job: Job) -> CreatedJob {
        CreatedJob {
            waiter: Some(state.inner.settled.watch(&job.id)),
            job,
            replayed: true,
        }
    }
}
