//! Every store operation, written once over [`Conn`]. The caller (the
//! engine in `store.rs`) supplies the transaction: on PostgreSQL one per
//! operation at READ COMMITTED, on SQLite the writer thread's batch (run
//! again with a savepoint per operation when one fails; an operation may
//! so run twice, and must not act outside its transaction). An operation
//! that returns an error has its writes rolled back.
//!
//! Lock order, on every path: the job's row first, then its attempts, then
//! the budgets its attempts reserve from or settle, in the order of their
//! names, so two transactions never wait on each other in a cycle.

use std::collections::BTreeMap;

use serde_json::Value;
use surety_core::{
    AttemptEvent, AttemptState, Fingerprint, JobEvent, JobState, TransitionError, attempt_after,
    job_after,
};

use crate::conn::{Conn, Param, Val, Values};
use crate::sql::{Returning, Sql};
use crate::{
    Answer, Attempt, AttemptHandle, AttemptRef, BudgetStatus, Charge, Created, Finish, Job, JobId,
    JobKind, NewJob, OwnerId, Question, Race, Reservation, Slot, Spend, StoreError, Trust, Unit,
    UnknownAttempt,
};

use Param::{Int, OptText, Text};

/// A validated new job: its id and fingerprint chosen, its first attempt's
/// provider and lease (in ms) when the caller starts one in the same commit.
#[derive(Debug, Clone)]
pub(crate) struct Insert {
    pub(crate) id: JobId,
    pub(crate) new: NewJob,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) first: Option<Begin>,
    /// The pages a new job may leave in use (SQLite with a size limit): the
    /// rest is kept for what acknowledged jobs still write.
    pub(crate) room: Option<i64>,
}

/// An attempt to start: its slot, provider and lease (in ms), and the
/// certification its provider's trust rests on, which the insert checks
/// against the open demotions.
#[derive(Debug, Clone)]
pub(crate) struct Begin {
    pub(crate) slot: Slot,
    pub(crate) provider: String,
    pub(crate) lease: i64,
    pub(crate) trust: Option<Trust>,
    /// Reserved in the attempt's own transaction, in the order of their
    /// budgets' names.
    pub(crate) charges: Vec<Charge>,
}

impl Begin {
    /// Why a guarded insert of this attempt returned no row when no other
    /// attempt holds its slot: an open demotion of its provider (the only
    /// other guard), or, unguarded, a broken invariant.
    fn refused(&self, otherwise: &str) -> StoreError {
        match &self.trust {
            Some(trust) => StoreError::Demoted {
                provider: self.provider.clone(),
                contract: trust.contract.clone(),
            },
            None => StoreError::Corrupt(otherwise.to_owned()),
        }
    }
}

/// What a job's insert answers: the job (new, replayed, or a conflict) and,
/// when it is new and asked to, its first attempt.
pub(crate) type Started = (Created, Option<AttemptHandle>);

/// Records the job, or finds the one this owner already made with this key.
/// The unique constraint decides; the fingerprint comparison only tells a
/// replay from a conflict. A new job may start its first attempt at once.
pub(crate) async fn create<C: Conn>(
    c: &mut C,
    sql: &Sql,
    insert: &Insert,
) -> Result<Started, StoreError> {
    let new = &insert.new;
    if let (Some(first), Some(statement)) = (&insert.first, &sql.insert_job_and_attempt)
        && first.charges.is_empty()
    {
        // One statement where the engine can: no transaction to open.
        let texts = job_texts(new);
        let params = one_params(insert, first, &texts);
        return match one(c, statement, first, &params).await? {
            Some(started) => Ok(started),
            None => nothing_written(c, sql, insert, first).await,
        };
    }
    let state = match insert.first {
        Some(_) => JobState::Running,
        None => JobState::Queued,
    };
    let texts = job_texts(new);
    let mut params = job_params(insert, &texts);
    params.push(Text(state.as_str()));
    let inserted = write_returning(c, &sql.insert_job, &params).await?;
    if let Some(row) = inserted {
        let job = job_from(&row)?;
        let handle = match &insert.first {
            None => None,
            Some(first) => {
                let params = attempt_params(&job.id, job.hedgeable, job.version, first);
                // No row: refused, and the error undoes the job's insert too.
                let row = write_returning(c, &sql.insert_first_attempt, &params)
                    .await?
                    .ok_or_else(|| first.refused("a new job already has an open attempt"))?;
                let attempt = attempt_from(&row)?;
                // Over a budget: the error undoes the job's insert too.
                reserve(
                    c,
                    sql,
                    Holder::Attempt(&job.id, attempt.ordinal),
                    &first.charges,
                )
                .await?;
                Some(handle_from(&attempt, !first.charges.is_empty()))
            }
        };
        if let (Some(room), Some(statement)) = (insert.room, &sql.pages_in_use) {
            let row = c.row(statement, &[]).await?.unwrap_or_default();
            let used = col(&row, 0, "pages")?.int("pages")?;
            if used > room {
                // Refused after the insert, so a replay is still answered;
                // the error undoes this write alone.
                return Err(StoreError::NotCommitted {
                    reason: format!(
                        "the database holds {used} pages, past the {room} new jobs may fill; the rest is kept for the results of jobs already acknowledged"
                    ),
                    outage: Some(crate::Outage::Full),
                });
            }
        }
        return Ok((Created::New(job), handle));
    }
    replay_or_conflict(c, sql, insert).await
}

/// The parameters of a single job's statement (`Sql::insert_job_and_attempt`
/// and, before its holds', `Sql::insert_job_attempt_and_holds`).
fn one_params<'a>(insert: &'a Insert, first: &'a Begin, texts: &'a JobTexts) -> Vec<Param<'a>> {
    let mut params = job_params(insert, texts);
    let (contract, certified_at) = trust_params(first);
    params.extend([
        Text(&first.provider),
        Int(first.lease),
        contract,
        certified_at,
    ]);
    params
}

/// A single job's statement: the new job and its first attempt, with its
/// charges held in it where it has any (the statement without holds is
/// taken only for an attempt that has none); `None` where it wrote nothing.
async fn one<C: Conn>(
    c: &mut C,
    statement: &str,
    first: &Begin,
    params: &[Param<'_>],
) -> Result<Option<Started>, StoreError> {
    let Some(row) = c.row(statement, params).await? else {
        return Ok(None);
    };
    let (job, attempt) = row.split_at(JOB_COLUMNS.min(row.len()));
    let handle = handle_from(&attempt_from(attempt)?, !first.charges.is_empty());
    Ok(Some((Created::New(job_from(job)?), Some(handle))))
}

/// What a new job's insert that wrote nothing answers (the key is taken,
/// or the provider is demoted): the job the key names.
async fn nothing_written<C: Conn>(
    c: &mut C,
    sql: &Sql,
    insert: &Insert,
    first: &Begin,
) -> Result<Started, StoreError> {
    match find(c, sql, &insert.new, &insert.fingerprint).await? {
        Some(found) => Ok((found, None)),
        None => Err(first.refused("the key's job vanished")),
    }
}

/// Records new jobs, each starting its first attempt, in one statement
/// (`Sql::insert_jobs_and_attempts`, PostgreSQL): an answer per insert, in
/// their order, as [`create`] gives it. `Err` only when the statement failed,
/// which wrote nothing. Every insert must carry its first attempt.
pub(crate) async fn create_many<C: Conn>(
    c: &mut C,
    sql: &Sql,
    inserts: &[Insert],
) -> Result<Vec<Result<Started, StoreError>>, StoreError> {
    if let [one] = inserts {
        // The single-job statement: cheaper than a batch of one.
        return Ok(vec![create(c, sql, one).await]);
    }
    insert_many(c, sql, inserts, false).await
}

/// [`create_many`] with the first attempts' reservations in the same
/// statement (`Sql::insert_jobs_attempts_and_holds`), for a batch of one
/// too: `Ok(None)` where a budget had no room for them all, and nothing of
/// the batch was written.
pub(crate) async fn create_many_reserving<C: Conn>(
    c: &mut C,
    sql: &Sql,
    inserts: &[Insert],
) -> Result<Option<Vec<Result<Started, StoreError>>>, StoreError> {
    let together = match (inserts, &sql.insert_job_attempt_and_holds) {
        // The single-job statement: cheaper than a batch of one.
        (
            [
                insert @ Insert {
                    first: Some(first), ..
                },
            ],
            Some(statement),
        ) => {
            let texts = job_texts(&insert.new);
            let mut params = one_params(insert, first, &texts);
            let sums = sums(first.charges.iter());
            let holds = HoldColumns::of(first.charges.iter(), &sums);
            params.extend(holds.params());
            match one(c, statement, first, &params).await {
                Ok(Some(started)) => Ok(vec![Ok(started)]),
                Ok(None) => Ok(vec![nothing_written(c, sql, insert, first).await]),
                Err(e) => Err(e),
            }
        }
        _ => insert_many(c, sql, inserts, true).await,
    };
    match together {
        Err(StoreError::Database(sqlx::Error::Database(e)))
            if e.code().as_deref() == Some(NO_ROOM) =>
        {
            Ok(None)
        }
        out => out.map(Some),
    }
}

/// The SQLSTATE `surety_hold` raises where a budget has no room for a
/// batch's holds (migration 0014).
const NO_ROOM: &str = "SU429";

/// The batch statement of [`create_many`], reserving the first attempts'
/// charges in it where `reserving`.
async fn insert_many<C: Conn>(
    c: &mut C,
    sql: &Sql,
    inserts: &[Insert],
    reserving: bool,
) -> Result<Vec<Result<Started, StoreError>>, StoreError> {
    let statement = match reserving {
        true => sql.insert_jobs_attempts_and_holds.as_deref(),
        false => sql.insert_jobs_and_attempts.as_deref(),
    }
    .ok_or_else(|| StoreError::Corrupt("this engine inserts no batch of jobs".to_owned()))?;
    let mut firsts = Vec::with_capacity(inserts.len());
    for insert in inserts {
        firsts.push(insert.first.as_ref().ok_or_else(|| {
            StoreError::Corrupt("a batch of new jobs without their first attempt".to_owned())
        })?);
    }
    // In key order: two batches that share keys take them in one order.
    let mut order: Vec<usize> = (0..inserts.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&inserts[a].new, &inserts[b].new);
        (&a.owner.0, a.key.as_str()).cmp(&(&b.owner.0, b.key.as_str()))
    });
    let texts: Vec<JobTexts> = order.iter().map(|&i| job_texts(&inserts[i].new)).collect();
    let column = |f: &dyn Fn(&Insert) -> &str| -> Vec<&str> {
        order.iter().map(|&i| f(&inserts[i])).collect()
    };
    let (ids, owners, keys, routes) = (
        column(&|i| &i.id.0),
        column(&|i| &i.new.owner.0),
        column(&|i| i.new.key.as_str()),
        column(&|i| &i.new.route),
    );
    let (contracts, digests, fingerprints, kinds) = (
        column(&|i| &i.new.contract),
        column(&|i| &i.new.contract_digest),
        column(&|i| i.fingerprint.as_str()),
        column(&|i| i.new.kind.as_str()),
    );
    let inputs: Vec<&str> = texts.iter().map(|t| t.input.as_str()).collect();
    let messages: Vec<Option<&str>> = texts.iter().map(|t| t.messages.as_deref()).collect();
    let requests: Vec<Option<&str>> = texts.iter().map(|t| t.request.as_deref()).collect();
    let hedgeable: Vec<i64> = order
        .iter()
        .map(|&i| i64::from(inserts[i].new.hedgeable))
        .collect();
    let providers: Vec<&str> = order.iter().map(|&i| firsts[i].provider.as_str()).collect();
    let leases: Vec<i64> = order.iter().map(|&i| firsts[i].lease).collect();
    let trusted: Vec<Option<&str>> = order
        .iter()
        .map(|&i| firsts[i].trust.as_ref().map(|t| t.contract.as_str()))
        .collect();
    let certified: Vec<i64> = order
        .iter()
        .map(|&i| firsts[i].trust.as_ref().map_or(0, |t| t.certified_at_ms))
        .collect();
    let mut params = vec![
        Param::Texts(&ids),
        Param::Texts(&owners),
        Param::Texts(&keys),
        Param::Texts(&routes),
        Param::Texts(&contracts),
        Param::Texts(&digests),
        Param::Texts(&inputs),
        Param::Texts(&fingerprints),
        Param::Ints(&hedgeable),
        Param::Texts(&kinds),
        Param::OptTexts(&messages),
        Param::OptTexts(&requests),
        Param::Texts(&providers),
        Param::Ints(&leases),
        Param::OptTexts(&trusted),
        Param::Ints(&certified),
    ];
    // Each hold names its job by its place in the arrays (from 1).
    let charges = || {
        order
            .iter()
            .enumerate()
            .flat_map(|(at, &i)| firsts[i].charges.iter().map(move |c| (at as i64 + 1, c)))
    };
    let reserved = reserving.then(|| {
        let of: Vec<i64> = charges().map(|(at, _)| at).collect();
        let sums = sums(charges().map(|(_, c)| c));
        (of, HoldColumns::of(charges().map(|(_, c)| c), &sums))
    });
    if let Some((of, holds)) = &reserved {
        params.push(Param::Ints(of));
        params.extend(holds.params());
    }
    // The statement's error is the batch's: it wrote nothing. Past it,
    // each item's answer is its own, so no item written is run again.
    let rows = c.rows(statement, &params).await?;
    let mut answers: Vec<Option<Result<Started, StoreError>>> =
        inserts.iter().map(|_| None).collect();
    for row in &rows {
        let Some(at) = row
            .first()
            .and_then(|id| inserts.iter().position(|i| id.is_text(&i.id.0)))
        else {
            continue;
        };
        let (job, attempt) = row.split_at(JOB_COLUMNS.min(row.len()));
        answers[at] = Some(job_from(job).and_then(|job| {
            let charged = reserving && !firsts[at].charges.is_empty();
            Ok((
                Created::New(job),
                Some(handle_from(&attempt_from(attempt)?, charged)),
            ))
        }));
    }
    // Nothing written for the rest: the key is taken (by another caller, or
    // earlier in this batch), or the provider is demoted.
    let mut out = Vec::with_capacity(inserts.len());
    for ((answer, insert), first) in answers.into_iter().zip(inserts).zip(&firsts) {
        out.push(match answer {
            Some(answer) => answer,
            None => nothing_written(c, sql, insert, first).await,
        });
    }
    Ok(out)
}

/// The job the key already names: a replay when the intent is the same.
async fn replay_or_conflict<C: Conn>(
    c: &mut C,
    sql: &Sql,
    insert: &Insert,
) -> Result<Started, StoreError> {
    let found = find(c, sql, &insert.new, &insert.fingerprint)
        .await?
        .ok_or_else(|| StoreError::Corrupt("the key's job vanished".to_owned()))?;
    Ok((found, None))
}

/// The job this owner's key names, if any: a replay when the intent is the
/// same, else a conflict.
pub(crate) async fn find<C: Conn>(
    c: &mut C,
    sql: &Sql,
    new: &NewJob,
    fingerprint: &Fingerprint,
) -> Result<Option<Created>, StoreError> {
    let Some(existing) = c
        .row(
            &sql.select_job_by_key,
            &[Text(&new.owner.0), Text(new.key.as_str())],
        )
        .await?
    else {
        return Ok(None);
    };
    let job = job_from(&existing)?;
    Ok(Some(match job.fingerprint == *fingerprint {
        true => Created::Replayed(job),
        false => Created::Conflict,
    }))
}

/// A new job's input, messages and request as JSON text.
struct JobTexts {
    input: String,
    messages: Option<String>,
    request: Option<String>,
}

fn job_texts(new: &NewJob) -> JobTexts {
    JobTexts {
        input: new.input.to_string(),
        messages: new.messages.as_ref().map(Value::to_string),
        request: new.request.as_ref().map(Value::to_string),
    }
}

/// The first parameters of `insert_job`, with the input, messages and
/// request as JSON text.
fn job_params<'a>(insert: &'a Insert, texts: &'a JobTexts) -> Vec<Param<'a>> {
    let new = &insert.new;
    vec![
        Text(&insert.id.0),
        Text(&new.owner.0),
        Text(new.key.as_str()),
        Text(&new.route),
        Text(&new.contract),
        Text(&new.contract_digest),
        Text(&texts.input),
        Text(insert.fingerprint.as_str()),
        Int(i64::from(new.hedgeable)),
        Text(new.kind.as_str()),
        OptText(texts.messages.as_deref()),
        OptText(texts.request.as_deref()),
    ]
}

/// The parameters of `insert_attempt` for a job locked at `version`.
fn attempt_params<'a>(
    job_id: &'a JobId,
    hedgeable: bool,
    version: i64,
    begin: &'a Begin,
) -> [Param<'a>; 8] {
    let (contract, certified_at) = trust_params(begin);
    [
        Text(&job_id.0),
        Int(begin.slot.as_i64()),
        Int(i64::from(hedgeable)),
        Text(&begin.provider),
        Int(version),
        Int(begin.lease),
        contract,
        certified_at,
    ]
}

/// The demotion guard's parameters: the contract (NULL, which no demotion
/// matches, for an unguarded attempt) and when the certification was made.
fn trust_params(begin: &Begin) -> (Param<'_>, Param<'_>) {
    match &begin.trust {
        Some(trust) => (OptText(Some(&trust.contract)), Int(trust.certified_at_ms)),
        None => (OptText(None), Int(0)),
    }
}

fn handle_from(attempt: &Attempt, charged: bool) -> AttemptHandle {
    AttemptHandle {
        job_id: attempt.job_id.clone(),
        ordinal: attempt.ordinal,
        slot: attempt.slot,
        provider: attempt.provider.clone(),
        base_version: attempt.base_version,
        charged,
    }
}

/// What holds a reservation: an attempt (its row written in the same
/// transaction), or one of the router's own checks, by its id.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Holder<'a> {
    Attempt(&'a JobId, i64),
    Check(&'a str),
}

impl<'a> Holder<'a> {
    /// The parameters that name it, before a hold's own.
    fn keys(&self) -> Vec<Param<'a>> {
        match *self {
            Holder::Attempt(job_id, ordinal) => vec![Text(&job_id.0), Int(ordinal)],
            Holder::Check(id) => vec![Text(id)],
        }
    }

    /// Its job's id, or the check's.
    fn key(&self) -> &'a str {
        match *self {
            Holder::Attempt(job_id, _) => &job_id.0,
            Holder::Check(id) => id,
        }
    }

    /// Its attempt's ordinal (a check has none: 0).
    fn ordinal(&self) -> i64 {
        match *self {
            Holder::Attempt(_, ordinal) => ordinal,
            Holder::Check(_) => 0,
        }
    }
}

/// What one transaction holds of a budget: its charges' sum, the
/// budget's limit (negative: none), and the earliest bucket any of them
/// counts spend from (counting more spend only ever refuses more).
struct Sum<'a> {
    budget: &'a str,
    amount: i64,
    limit: i64,
    counts_from: i64,
}

/// `charges` summed per budget, in the order of the budgets' names.
fn sums<'a>(charges: impl Iterator<Item = &'a Charge>) -> Vec<Sum<'a>> {
    let mut sums: BTreeMap<&str, Sum<'a>> = BTreeMap::new();
    for charge in charges {
        let sum = sums.entry(&charge.budget).or_insert(Sum {
            budget: &charge.budget,
            amount: 0,
            limit: charge.limit.unwrap_or(-1),
            counts_from: charge.counts_from_ms,
        });
        sum.amount = sum.amount.saturating_add(charge.amount);
        sum.counts_from = sum.counts_from.min(charge.counts_from_ms);
    }
    sums.into_values().collect()
}

/// Reserves `charges` for each holder: one statement opens their budgets
/// (on PostgreSQL locking their rows, in name order, so that two
/// reservations of a budget take turns and the second's guard reads every
/// hold the first committed), one guarded statement inserts every hold
/// where no budget passes its limit with its sum, its changed rows
/// checked; on PostgreSQL an attempt's holds are both in one call
/// (`surety_hold`). `Ok(false)`: none inserted.
async fn hold<C: Conn>(
    c: &mut C,
    sql: &Sql,
    holders: &[(Holder<'_>, &[Charge])],
    sums: &[Sum<'_>],
) -> Result<bool, StoreError> {
    let each = || {
        holders
            .iter()
            .flat_map(|(holder, charges)| charges.iter().map(move |c| (*holder, c)))
    };
    let n = each().count();
    if n == 0 {
        return Ok(true);
    }
    let attempts = holders
        .iter()
        .all(|(h, _)| matches!(h, Holder::Attempt(..)));
    let checks = holders.iter().all(|(h, _)| matches!(h, Holder::Check(_)));
    let inserted = match (attempts, &sql.insert_reservations) {
        // One call opens and locks the budgets, then inserts the holds.
        (true, Some(insert)) => {
            let ids: Vec<&str> = each().map(|(h, _)| h.key()).collect();
            let ordinals: Vec<i64> = each().map(|(h, _)| h.ordinal()).collect();
            let holds = HoldColumns::of(each().map(|(_, c)| c), sums);
            let mut params = vec![Param::Texts(&ids), Param::Ints(&ordinals)];
            params.extend(holds.params());
            let row = c.row(insert, &params).await?.ok_or_else(|| {
                StoreError::Corrupt("a reservation's call returned no row".to_owned())
            })?;
            u64::try_from(col(&row, 0, "n")?.int("n")?)
                .map_err(|_| StoreError::Corrupt("a negative count of holds".to_owned()))?
        }
        // One holder, each of its charges of a budget of its own: the
        // statement of `n` rows and `n` sums.
        _ if holders.len() == 1 && sums.len() == n && (attempts || checks) => {
            let names: Vec<Param<'_>> = sums.iter().map(|s| Text(s.budget)).collect();
            c.execute(&sql.open_budgets(sums.len()), &names).await?;
            let mut params = Vec::new();
            for (holder, charge) in each() {
                params.extend(holder.keys());
                params.extend([
                    Text(&charge.budget),
                    Int(charge.amount),
                    Text(charge.unit.as_str()),
                    Int(charge.bucket_ms),
                ]);
            }
            for sum in sums {
                params.extend([
                    Text(sum.budget),
                    Int(sum.amount),
                    Int(sum.limit),
                    Int(sum.counts_from),
                ]);
            }
            let statement = match attempts {
                true => sql.insert_reservation_rows(n),
                false => sql.insert_check_hold_rows(n),
            };
            c.execute(&statement, &params).await?
        }
        _ => {
            return Err(StoreError::Corrupt(
                "these holds cannot be reserved in one statement".to_owned(),
            ));
        }
    };
    match inserted {
        0 => Ok(false),
        k if k == n as u64 => Ok(true),
        k => Err(StoreError::Corrupt(format!(
            "{k} of {n} holds reserved: a reservation is all of them or none"
        ))),
    }
}

/// The first of `sums`' budgets (in name order) without room for its sum:
/// why a reservation was refused, as the budget stands.
async fn over_budget<C: Conn>(
    c: &mut C,
    sql: &Sql,
    sums: &[Sum<'_>],
) -> Result<StoreError, StoreError> {
    for sum in sums {
        let status = budget_status(c, sql, sum.budget, sum.counts_from).await?;
        if sum.limit >= 0 && status.held + sum.amount + status.spent > sum.limit {
            return Ok(StoreError::OverBudget {
                budget: sum.budget.to_owned(),
                limit: sum.limit,
                spent: status.spent,
                held: status.held,
                asked: sum.amount,
                oldest_bucket_ms: status.oldest_bucket_ms,
            });
        }
    }
    Err(StoreError::Corrupt(
        "a reservation was refused, yet each budget had room".to_owned(),
    ))
}

/// Reserves each charge for `holder`, all or none (see [`hold`]); over a
/// limit, the error rolls back everything this transaction wrote (the
/// attempt, and a new job with it).
pub(crate) async fn reserve<C: Conn>(
    c: &mut C,
    sql: &Sql,
    holder: Holder<'_>,
    charges: &[Charge],
) -> Result<(), StoreError> {
    let sums = sums(charges.iter());
    match hold(c, sql, &[(holder, charges)], &sums).await? {
        true => Ok(()),
        false => Err(over_budget(c, sql, &sums).await?),
    }
}

/// Holds and their budgets as `surety_hold` takes them, a column each:
/// each hold's budget, amount, unit and bucket; each budget's name, limit
/// and the bucket its spend counts from.
struct HoldColumns<'a> {
    budgets: Vec<&'a str>,
    amounts: Vec<i64>,
    units: Vec<&'static str>,
    buckets: Vec<i64>,
    names: Vec<&'a str>,
    limits: Vec<i64>,
    froms: Vec<i64>,
}

impl<'a> HoldColumns<'a> {
    fn of(charges: impl Iterator<Item = &'a Charge> + Clone, sums: &[Sum<'a>]) -> Self {
        HoldColumns {
            budgets: charges.clone().map(|c| c.budget.as_str()).collect(),
            amounts: charges.clone().map(|c| c.amount).collect(),
            units: charges.clone().map(|c| c.unit.as_str()).collect(),
            buckets: charges.map(|c| c.bucket_ms).collect(),
            names: sums.iter().map(|s| s.budget).collect(),
            limits: sums.iter().map(|s| s.limit).collect(),
            froms: sums.iter().map(|s| s.counts_from).collect(),
        }
    }

    fn params(&self) -> [Param<'_>; 7] {
        [
            Param::Texts(&self.budgets),
            Param::Ints(&self.amounts),
            Param::Texts(&self.units),
            Param::Ints(&self.buckets),
            Param::Texts(&self.names),
            Param::Ints(&self.limits),
            Param::Ints(&self.froms),
        ]
    }
}

/// What `spend` costs of a reservation, as the closing statements take it:
/// micros and tokens, both negative for its whole amount.
fn spend_params(spend: Spend) -> (i64, i64) {
    match spend {
        Spend::Nothing => (0, 0),
        Spend::Cost(cost) => (cost.micros.max(0), cost.tokens.max(0)),
        Spend::WorstCase => (-1, -1),
    }
}

/// Records what closed holds (rows of budget, spent, bucket) spent, in the
/// buckets they reserved in, in one statement; their closing alone frees
/// what they held (a budget's hold is summed from its open ones).
async fn record_spent<C: Conn>(c: &mut C, sql: &Sql, closed: &[Values]) -> Result<(), StoreError> {
    let mut spent: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for row in closed {
        let account = col(row, 0, "account")?.text("account")?;
        let amount = col(row, 1, "spent")?.int("spent")?;
        let bucket = col(row, 2, "bucket_ms")?.int("bucket_ms")?;
        *spent.entry((account, bucket)).or_default() += amount;
    }
    spent.retain(|_, amount| *amount > 0);
    if spent.is_empty() {
        return Ok(());
    }
    let params: Vec<Param<'_>> = spent
        .iter()
        .flat_map(|((account, bucket), amount)| [Text(account), Int(*bucket), Int(*amount)])
        .collect();
    c.execute(&sql.add_spends(spent.len()), &params).await?;
    Ok(())
}

impl Spend {
    pub(crate) fn of_answer(answer: &Answer) -> Spend {
        answer.cost.map_or(Spend::WorstCase, Spend::Cost)
    }
}

/// Settles attempt `ordinal`'s reservations still held: each budget holds
/// its amount less and has what it cost spent, in the bucket it was
/// reserved in. Each budget's row is locked (its hold released) before its
/// spend is written. A reservation settled already is left as it is.
pub(crate) async fn settle_reservations<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
    ordinal: i64,
    spend: Spend,
) -> Result<(), StoreError> {
    settle_held(c, sql, Holder::Attempt(job_id, ordinal), spend).await
}

/// Settles the holds of checks older than `age_ms` (at most `most`) to
/// their worst case: the router that took them is gone, and their calls
/// may have been billed. The number of checks settled.
pub(crate) async fn settle_stale_checks<C: Conn>(
    c: &mut C,
    sql: &Sql,
    age_ms: i64,
    most: i64,
) -> Result<u64, StoreError> {
    let stale = c
        .rows(&sql.select_stale_checks, &[Int(age_ms), Int(most)])
        .await?;
    for row in &stale {
        let id = col(row, 0, "id")?.text("id")?;
        settle_held(c, sql, Holder::Check(&id), Spend::WorstCase).await?;
    }
    Ok(stale.len() as u64)
}

/// Settles what `holder` holds of each budget: one guarded statement
/// closes its holds still open (of two settlers that both come, one closes
/// them), each spent at `spend`, and [`record_spent`] records what it
/// closed.
pub(crate) async fn settle_held<C: Conn>(
    c: &mut C,
    sql: &Sql,
    holder: Holder<'_>,
    spend: Spend,
) -> Result<(), StoreError> {
    let closing = match holder {
        Holder::Attempt(..) => &sql.close_reservations,
        Holder::Check(_) => &sql.close_check_holds,
    };
    let (micros, tokens) = spend_params(spend);
    let mut params = holder.keys();
    params.extend([Int(micros), Int(tokens)]);
    let closed = match &closing.read_first {
        None => c.rows(&closing.write, &params).await?,
        Some(read) => {
            let closed = c.rows(read, &params).await?;
            c.execute(&closing.write, &params).await?;
            closed
        }
    };
    record_spent(c, sql, &closed).await
}

/// Budget `budget` as the database holds it: its spend from the bucket at
/// `counts_from_ms` on, what it holds, and of that what unknown attempts
/// hold. A budget nothing reserved from yet holds and spent nothing.
pub(crate) async fn budget_status<C: Conn>(
    c: &mut C,
    sql: &Sql,
    budget: &str,
    counts_from_ms: i64,
) -> Result<BudgetStatus, StoreError> {
    let row = c
        .row(&sql.select_budget, &[Text(budget), Int(counts_from_ms)])
        .await?;
    let Some(row) = row else {
        return Ok(BudgetStatus {
            budget: budget.to_owned(),
            spent: 0,
            held: 0,
            held_by_unknown: 0,
            oldest_bucket_ms: None,
        });
    };
    Ok(BudgetStatus {
        budget: budget.to_owned(),
        held: col(&row, 0, "held")?.int("held")?,
        spent: col(&row, 1, "spent")?.int("spent")?,
        held_by_unknown: col(&row, 2, "unknown")?.int("unknown")?,
        oldest_bucket_ms: col(&row, 3, "oldest")?.opt_int("oldest")?,
    })
}

/// Job `job_id`'s reservations, by attempt and budget.
pub(crate) async fn reservations<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
) -> Result<Vec<Reservation>, StoreError> {
    let rows = c.rows(&sql.select_reservations, &[Text(&job_id.0)]).await?;
    rows.iter()
        .map(|row| {
            let unit = col(row, 2, "unit")?.text("unit")?;
            Ok(Reservation {
                ordinal: col(row, 0, "ordinal")?.int("ordinal")?,
                budget: col(row, 1, "account")?.text("account")?,
                unit: Unit::parse(&unit)
                    .ok_or_else(|| StoreError::Corrupt(format!("unit: unknown `{unit}`")))?,
                amount: col(row, 3, "amount")?.int("amount")?,
                reserved_at_ms: col(row, 4, "reserved_at_ms")?.int("reserved_at_ms")?,
                spent: col(row, 5, "spent")?.opt_int("spent")?,
                settled_at_ms: col(row, 6, "settled_at_ms")?.opt_int("settled_at_ms")?,
            })
        })
        .collect()
}

/// Starts an attempt, if no attempt of the job holds the slot.
pub(crate) async fn start_attempt<C: Conn>(
    c: &mut C,
    sql: &Sql,
    owner: &OwnerId,
    job_id: &JobId,
    start: &Begin,
) -> Result<AttemptHandle, StoreError> {
    let slot = start.slot;
    // Locks the job and marks it running; a refusal below rolls it back.
    let locked = lock_job(c, &sql.claim_job, owner, job_id).await?;
    job_after(locked.state, JobEvent::AttemptStarted)?;
    if slot == Slot::Hedge {
        if !locked.hedgeable {
            return Err(StoreError::HedgeRefused {
                job_id: job_id.clone(),
                reason: "the job's contract has side effects",
            });
        }
        let primary = c
            .row(
                &sql.select_open_attempt,
                &[Text(&job_id.0), Int(Slot::Primary.as_i64())],
            )
            .await?;
        if primary.is_none() {
            return Err(StoreError::HedgeRefused {
                job_id: job_id.clone(),
                reason: "no attempt is open to hedge",
            });
        }
    }
    let params = attempt_params(job_id, locked.hedgeable, locked.version, start);
    let Some(row) = write_returning(c, &sql.insert_attempt, &params).await? else {
        let open = c
            .row(
                &sql.select_open_attempt,
                &[Text(&job_id.0), Int(slot.as_i64())],
            )
            .await?
            .ok_or_else(|| start.refused("the open attempt vanished"))?;
        let open = attempt_from(&open)?;
        return Err(StoreError::AttemptOpen {
            job_id: job_id.clone(),
            ordinal: open.ordinal,
            state: open.state,
        });
    };
    let attempt = attempt_from(&row)?;
    // Over a budget: the error undoes the attempt and the job's claim.
    reserve(
        c,
        sql,
        Holder::Attempt(job_id, attempt.ordinal),
        &start.charges,
    )
    .await?;
    Ok(handle_from(&attempt, !start.charges.is_empty()))
}

/// Renews a started attempt's lease; refused once it expired or left `started`.
pub(crate) async fn heartbeat<C: Conn>(
    c: &mut C,
    sql: &Sql,
    handle: &AttemptHandle,
    lease: i64,
) -> Result<(), StoreError> {
    let renewed = c
        .execute(
            &sql.heartbeat,
            &[Text(&handle.job_id.0), Int(handle.ordinal), Int(lease)],
        )
        .await?;
    if renewed == 1 {
        return Ok(());
    }
    let attempt = attempt(c, sql, &handle.job_id, handle.ordinal).await?;
    match attempt.state {
        AttemptState::Started => Err(StoreError::LeaseExpired {
            job_id: handle.job_id.clone(),
            ordinal: handle.ordinal,
        }),
        state => Err(refusal(state, AttemptEvent::Heartbeat)),
    }
}

/// A result, through compare-and-swap: it becomes the job's only if the job
/// is still at the version the attempt started from, nobody completed it,
/// and the attempt is still open. Otherwise the attempt is `lost`, the
/// result is dropped and the race is recorded.
pub(crate) async fn complete<C: Conn>(
    c: &mut C,
    sql: &Sql,
    handle: &AttemptHandle,
    answer: &Answer,
) -> Result<Finish, StoreError> {
    // The job's lock first where the engine needs it: on PostgreSQL a
    // statement that waited for a row lock still reads other rows as of when
    // it began, so the guards of the compare-and-swap are read by a statement
    // that starts after the lock. SQLite's one writer reads them as the last
    // commit left them, and reads the winner only after a loss.
    let locked = match sql.lock_before_swap {
        true => Some(lock_job_unscoped(c, sql, &handle.job_id).await?),
        false => None,
    };
    // The compare-and-swap: one statement; the row it returns (on SQLite,
    // the one row it changed, read back) is the proof it touched one.
    let (result, completion) = answer_texts(answer);
    let won = write_returning(
        c,
        &sql.complete_job,
        &cas_params(handle, &result, completion.as_deref()),
    )
    .await?;
    if let Some(row) = won {
        let job = job_from(&row)?;
        close_attempt(
            c,
            sql,
            handle,
            AttemptState::Succeeded,
            None,
            answer.response_id.as_deref(),
        )
        .await?;
        if handle.charged {
            let spend = Spend::of_answer(answer);
            settle_reservations(c, sql, &handle.job_id, handle.ordinal, spend).await?;
        }
        return Ok(Finish::Won(Box::new(job)));
    }
    // Lost: close the attempt if it is still open and record the race.
    let winner = match locked {
        Some(winner) => winner,
        None => lock_job_unscoped(c, sql, &handle.job_id).await?,
    };
    let attempt = attempt(c, sql, &handle.job_id, handle.ordinal).await?;
    let reason = match attempt.state {
        AttemptState::Cancelled => "the attempt had been cancelled out of band",
        state if state.is_open() => "another attempt completed the job first",
        state => return Err(refusal(state, AttemptEvent::Won)),
    };
    if attempt.state.is_open() {
        close_attempt(c, sql, handle, AttemptState::Lost, Some(reason), None).await?;
        if handle.charged {
            // The loser's answer is dropped, but the provider did its work.
            let spend = Spend::of_answer(answer);
            settle_reservations(c, sql, &handle.job_id, handle.ordinal, spend).await?;
        }
    }
    let race_id = uuid::Uuid::now_v7().to_string();
    c.execute(
        &sql.record_race,
        &[
            Text(&handle.job_id.0),
            Text(&race_id),
            Int(handle.ordinal),
            Text(reason),
        ],
    )
    .await?;
    settle(c, sql, &handle.job_id, JobState::Queued).await?;
    Ok(Finish::Lost { winner })
}

/// Runs a [`Returning`] write: the row it wrote, or `None` when it changed
/// no row.
async fn write_returning<C: Conn>(
    c: &mut C,
    statement: &Returning,
    params: &[Param<'_>],
) -> Result<Option<Values>, StoreError> {
    let Some(read) = &statement.read else {
        return c.row(&statement.write, params).await;
    };
    if c.execute(&statement.write, params).await? == 0 {
        return Ok(None);
    }
    c.row(read, Returning::read_params(params)).await
}

/// As [`complete`]; when the attempt won, also the job's attempts as the
/// same write leaves them, read in its transaction.
pub(crate) async fn complete_with_attempts<C: Conn>(
    c: &mut C,
    sql: &Sql,
    handle: &AttemptHandle,
    answer: &Answer,
) -> Result<(Finish, Option<Vec<Attempt>>), StoreError> {
    let finish = complete(c, sql, handle, answer).await?;
    let attempts = match finish {
        Finish::Won(_) => Some(attempts_of(c, sql, &handle.job_id).await?),
        Finish::Lost { .. } | Finish::Failed => None,
    };
    Ok((finish, attempts))
}

/// A job's attempts, in order.
async fn attempts_of<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
) -> Result<Vec<Attempt>, StoreError> {
    c.rows(&sql.select_attempts, &[Text(&job_id.0)])
        .await?
        .iter()
        .map(|row| attempt_from(row))
        .collect()
}

/// What the compare-and-swap in one statement gives an attempt: when it
/// won, the job and, when the statement could tell them exactly, its
/// attempts as the win left them; `None` when it did not win (and nothing
/// changed), for [`complete`] to record the loss.
pub(crate) type AtOnce = Option<(Job, Option<Vec<Attempt>>)>;

/// The compare-and-swap in one statement, where the engine has it
/// (`Sql::complete_and_close`). `None` where it has not.
pub(crate) async fn complete_at_once<C: Conn>(
    c: &mut C,
    sql: &Sql,
    handle: &AttemptHandle,
    answer: &Answer,
) -> Result<AtOnce, StoreError> {
    let statement = match handle.charged {
        true => &sql.complete_and_settle_one,
        false => &sql.complete_and_close_one,
    };
    let Some(statement) = statement else {
        return Ok(None);
    };
    let (result, completion) = answer_texts(answer);
    let mut params = cas_close_params(
        handle,
        &result,
        completion.as_deref(),
        answer.response_id.as_deref(),
    )
    .to_vec();
    if handle.charged {
        let (micros, tokens) = spend_params(Spend::of_answer(answer));
        params.extend([Int(micros), Int(tokens)]);
    }
    let rows = c.rows(statement, &params).await?;
    // The attempt closed here is among them whenever they came.
    Ok(job_rows(&rows)?.map(|(job, attempts)| (job, (!attempts.is_empty()).then_some(attempts))))
}

/// [`complete_at_once`] for several attempts, an answer each in their
/// order. One statement takes at most one attempt per job: the guards of
/// two would both be read before either closed, so a second attempt of a
/// job runs alone after it. `Err` only when that statement failed, which
/// wrote nothing; past it, each item's answer is its own, so no item
/// written is run again.
pub(crate) async fn complete_many<C: Conn>(
    c: &mut C,
    sql: &Sql,
    items: &[(AttemptHandle, Answer)],
) -> Result<Vec<Result<AtOnce, StoreError>>, StoreError> {
    let mut first: Vec<usize> = Vec::with_capacity(items.len());
    let mut repeats = Vec::new();
    for (i, (handle, _)) in items.iter().enumerate() {
        match first.iter().any(|&f| items[f].0.job_id == handle.job_id) {
            true => repeats.push(i),
            false => first.push(i),
        }
    }
    let mut answers: Vec<Result<AtOnce, StoreError>> = items.iter().map(|_| Ok(None)).collect();
    if let [one] = first[..] {
        // The single-attempt statement: cheaper than a batch of one.
        answers[one] = complete_at_once(c, sql, &items[one].0, &items[one].1).await;
    } else {
        // Where any reserved, the statement that settles what they reserved.
        let settles = first.iter().any(|&i| items[i].0.charged);
        let statement = match settles {
            true => &sql.complete_and_settle,
            false => &sql.complete_and_close,
        };
        let statement = statement.as_deref().ok_or_else(|| {
            StoreError::Corrupt("this engine has no compare-and-swap batch".to_owned())
        })?;
        let texts: Vec<(String, Option<String>)> =
            first.iter().map(|&i| answer_texts(&items[i].1)).collect();
        let ids: Vec<&str> = first
            .iter()
            .map(|&i| items[i].0.job_id.0.as_str())
            .collect();
        let versions: Vec<i64> = first.iter().map(|&i| items[i].0.base_version).collect();
        let ordinals: Vec<i64> = first.iter().map(|&i| items[i].0.ordinal).collect();
        let results: Vec<&str> = texts.iter().map(|(r, _)| r.as_str()).collect();
        let completions: Vec<Option<&str>> = texts.iter().map(|(_, c)| c.as_deref()).collect();
        let response_ids: Vec<Option<&str>> = first
            .iter()
            .map(|&i| items[i].1.response_id.as_deref())
            .collect();
        let costs = settles.then(|| {
            first
                .iter()
                .map(|&i| spend_params(Spend::of_answer(&items[i].1)))
                .unzip::<i64, i64, Vec<i64>, Vec<i64>>()
        });
        let mut params = vec![
            Param::Texts(&ids),
            Param::Ints(&versions),
            Param::Texts(&results),
            Param::Ints(&ordinals),
            Param::OptTexts(&completions),
            Param::OptTexts(&response_ids),
        ];
        if let Some((micros, tokens)) = &costs {
            params.extend([Param::Ints(micros), Param::Ints(tokens)]);
        }
        let rows = c.rows(statement, &params).await?;
        // A job's rows come together (ordered by its id, its first column).
        for rows in rows.chunk_by(|a, b| a.first() == b.first()) {
            let Some(at) = rows.first().and_then(|row| row.first()).and_then(|id| {
                first
                    .iter()
                    .copied()
                    .find(|&i| id.is_text(&items[i].0.job_id.0))
            }) else {
                continue;
            };
            // The attempt closed here is among them whenever they came.
            answers[at] = job_rows(rows).map(|won| {
                won.map(|(job, attempts)| (job, (!attempts.is_empty()).then_some(attempts)))
            });
        }
    }
    for i in repeats {
        answers[i] = complete_at_once(c, sql, &items[i].0, &items[i].1).await;
    }
    Ok(answers)
}

/// An answer's result and completion as JSON text.
fn answer_texts(answer: &Answer) -> (String, Option<String>) {
    (
        answer.result.to_string(),
        answer.completion.as_ref().map(Value::to_string),
    )
}

fn cas_params<'a>(
    handle: &'a AttemptHandle,
    result: &'a str,
    completion: Option<&'a str>,
) -> [Param<'a>; 5] {
    [
        Text(&handle.job_id.0),
        Int(handle.base_version),
        Text(result),
        Int(handle.ordinal),
        OptText(completion),
    ]
}

/// The one-statement compare-and-swap's parameters: [`cas_params`], then
/// the answer's response id for the attempt it closes.
fn cas_close_params<'a>(
    handle: &'a AttemptHandle,
    result: &'a str,
    completion: Option<&'a str>,
    response_id: Option<&'a str>,
) -> [Param<'a>; 6] {
    let [a, b, c, d, e] = cas_params(handle, result, completion);
    [a, b, c, d, e, OptText(response_id)]
}

/// A definite failure: the attempt is `failed`; the job waits for the next
/// attempt, or is `failed` when the caller gives up.
pub(crate) async fn fail<C: Conn>(
    c: &mut C,
    sql: &Sql,
    handle: &AttemptHandle,
    (error, give_up): (&str, bool),
    spend: Spend,
) -> Result<Finish, StoreError> {
    lock_job_unscoped(c, sql, &handle.job_id).await?;
    if !close_attempt(c, sql, handle, AttemptState::Failed, Some(error), None).await? {
        return Err(refused(c, sql, &handle.job_id, handle.ordinal, AttemptEvent::Failed).await);
    }
    if handle.charged {
        settle_reservations(c, sql, &handle.job_id, handle.ordinal, spend).await?;
    }
    let idle = match give_up {
        true => JobState::Failed,
        false => JobState::Queued,
    };
    settle(c, sql, &handle.job_id, idle).await?;
    Ok(Finish::Failed)
}

/// The attempt timed out after its request left: it becomes `unknown`, and
/// so does its job unless another attempt is running.
pub(crate) async fn mark_unknown<C: Conn>(
    c: &mut C,
    sql: &Sql,
    handle: &AttemptHandle,
    reason: &str,
) -> Result<(), StoreError> {
    lock_job_unscoped(c, sql, &handle.job_id).await?;
    let marked = c
        .execute(
            &sql.mark_unknown,
            &[Text(&handle.job_id.0), Int(handle.ordinal), Text(reason)],
        )
        .await?;
    if marked == 0 {
        return Err(refused(
            c,
            sql,
            &handle.job_id,
            handle.ordinal,
            AttemptEvent::TimedOut,
        )
        .await);
    }
    settle(c, sql, &handle.job_id, JobState::Queued).await
}

/// Resolves an open attempt out of band. The job's version does not move,
/// so any other open attempt of the job is unaffected.
pub(crate) async fn cancel_attempt<C: Conn>(
    c: &mut C,
    sql: &Sql,
    owner: &OwnerId,
    job_id: &JobId,
    ordinal: i64,
    reason: &str,
) -> Result<(), StoreError> {
    lock_job(c, &sql.lock_job, owner, job_id).await?;
    let handle = AttemptHandle {
        job_id: job_id.clone(),
        ordinal,
        slot: Slot::Primary,
        provider: String::new(),
        base_version: 0,
        charged: true,
    };
    if !close_attempt(c, sql, &handle, AttemptState::Cancelled, Some(reason), None).await? {
        return Err(refused(c, sql, job_id, ordinal, AttemptEvent::Cancelled).await);
    }
    // Ended by a person: whether the provider billed it is not known.
    settle_reservations(c, sql, job_id, ordinal, Spend::WorstCase).await?;
    settle(c, sql, job_id, JobState::Queued).await
}

/// Cancels the owner's job when nothing of it may still run: it is queued
/// or failed, with no attempt open. A job already cancelled stays so; an
/// open attempt (started, or unknown: the provider may be doing the work)
/// refuses, as a final job does. The row lock, then one guarded statement
/// with its count checked: a claim that got in first leaves it running.
pub(crate) async fn cancel_job<C: Conn>(
    c: &mut C,
    sql: &Sql,
    owner: &OwnerId,
    job_id: &JobId,
) -> Result<(), StoreError> {
    let locked = lock_job(c, &sql.lock_job, owner, job_id).await?;
    if locked.state == JobState::Cancelled {
        return Ok(());
    }
    job_after(locked.state, JobEvent::Cancelled)?;
    let attempts = c.rows(&sql.select_attempts, &[Text(&job_id.0)]).await?;
    for row in &attempts {
        let attempt = attempt_from(row)?;
        if attempt.state.is_open() {
            return Err(StoreError::AttemptOpen {
                job_id: job_id.clone(),
                ordinal: attempt.ordinal,
                state: attempt.state,
            });
        }
    }
    let cancelled = c
        .execute(&sql.cancel_job, &[Text(&job_id.0), Text(&owner.0)])
        .await?;
    if cancelled == 0 {
        return Err(StoreError::Transition(TransitionError::Job {
            from: locked.state,
            event: JobEvent::Cancelled,
        }));
    }
    Ok(())
}

/// Marks the owner's Responses job deleted; false when there is no such
/// job, or it was deleted already.
pub(crate) async fn delete_response<C: Conn>(
    c: &mut C,
    sql: &Sql,
    owner: &OwnerId,
    job_id: &JobId,
) -> Result<bool, StoreError> {
    let deleted = c
        .execute(&sql.delete_response, &[Text(&job_id.0), Text(&owner.0)])
        .await?;
    Ok(deleted == 1)
}

/// Notes the provider's id for an attempt's answer, once (a later note,
/// or the answer's own, keeps the first). The job's row is written first,
/// as by every write that changes an attempt.
pub(crate) async fn note_response_id<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
    ordinal: i64,
    id: &str,
) -> Result<bool, StoreError> {
    lock_job_unscoped(c, sql, job_id).await?;
    let noted = c
        .execute(
            &sql.note_response_id,
            &[Text(&job_id.0), Int(ordinal), Text(id)],
        )
        .await?;
    Ok(noted == 1)
}

/// Provider `provider`'s unknown attempts due a question: unknown for at
/// least `after_ms`, last asked at least `every_ms` ago (or never), and
/// unknown for less than `horizon_ms`; least recently asked first.
pub(crate) async fn due_unknowns<C: Conn>(
    c: &mut C,
    sql: &Sql,
    provider: &str,
    (after_ms, every_ms, horizon_ms): (i64, i64, i64),
    limit: i64,
) -> Result<Vec<UnknownAttempt>, StoreError> {
    c.rows(
        &sql.select_due_unknowns,
        &[
            Text(provider),
            Int(after_ms),
            Int(every_ms),
            Int(horizon_ms),
            Int(limit),
        ],
    )
    .await?
    .iter()
    .map(|row| {
        let (attempt, rest) = row.split_at(ATTEMPT_WIDTH.min(row.len()));
        Ok(UnknownAttempt {
            attempt: attempt_from(attempt)?,
            owner: OwnerId(col(rest, 0, "owner_id")?.text("owner_id")?),
        })
    })
    .collect()
}

/// Records a question about an attempt and its answer, and when the
/// attempt was last asked about. The job's row is written first.
pub(crate) async fn record_question<C: Conn>(
    c: &mut C,
    sql: &Sql,
    q: &Question,
    job_id: &JobId,
) -> Result<(), StoreError> {
    lock_job_unscoped(c, sql, job_id).await?;
    c.execute(
        &sql.insert_question,
        &[
            Text(&job_id.0),
            Int(q.ordinal),
            Text(&q.provider),
            Text(&q.asked_by),
            Text(&q.outcome),
            Text(&q.detail),
        ],
    )
    .await?;
    c.execute(&sql.mark_asked, &[Text(&job_id.0), Int(q.ordinal)])
        .await?;
    Ok(())
}

/// A job's questions, by attempt, in order.
pub(crate) async fn questions<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
) -> Result<Vec<Question>, StoreError> {
    c.rows(&sql.select_questions, &[Text(&job_id.0)])
        .await?
        .iter()
        .map(|row| {
            let get = |i: usize, name: &str| col(row, i, name);
            Ok(Question {
                ordinal: get(0, "ordinal")?.int("ordinal")?,
                n: get(1, "n")?.int("n")?,
                provider: get(2, "provider")?.text("provider")?,
                asked_at_ms: get(3, "asked_at_ms")?.int("asked_at_ms")?,
                asked_by: get(4, "asked_by")?.text("asked_by")?,
                outcome: get(5, "outcome")?.text("outcome")?,
                detail: get(6, "detail")?.text("detail")?,
            })
        })
        .collect()
}

/// The attempts whose lease has expired, on the database's clock.
pub(crate) async fn expired<C: Conn>(
    c: &mut C,
    sql: &Sql,
    limit: i64,
) -> Result<Vec<AttemptRef>, StoreError> {
    c.rows(&sql.select_expired, &[Int(limit)])
        .await?
        .iter()
        .map(|row| {
            Ok(AttemptRef {
                job_id: JobId(col(row, 0, "job_id")?.text("job_id")?),
                ordinal: col(row, 1, "ordinal")?.int("ordinal")?,
                owner: OwnerId(col(row, 2, "owner_id")?.text("owner_id")?),
            })
        })
        .collect()
}

/// Turns one expired attempt `unknown`; false when a heartbeat or another
/// reaper got there first.
pub(crate) async fn reap<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
    ordinal: i64,
) -> Result<bool, StoreError> {
    lock_job_unscoped(c, sql, job_id).await?;
    let moved = c
        .execute(&sql.reap_attempt, &[Text(&job_id.0), Int(ordinal)])
        .await?;
    if moved == 1 {
        settle(c, sql, job_id, JobState::Queued).await?;
    }
    Ok(moved == 1)
}

/// Deletes at most `limit` settled jobs older than `older_than_ms`, with
/// their attempts and races; returns how many jobs went.
pub(crate) async fn prune_settled<C: Conn>(
    c: &mut C,
    sql: &Sql,
    older_than_ms: i64,
    limit: i64,
) -> Result<u64, StoreError> {
    // A prune lost to a crash before its WAL was flushed is made again by
    // the next pass: on PostgreSQL its commit does not wait for the flush.
    if let Some(relaxed) = &sql.relaxed_commit {
        c.execute(relaxed, &[]).await?;
    }
    let mut pruned = 0;
    for statement in &sql.prune_settled {
        pruned = c
            .execute(statement, &[Int(older_than_ms), Int(limit)])
            .await?;
    }
    Ok(pruned)
}

/// Jobs in `state`, of `owner` or of every owner, in order of their last
/// change (`oldest` first or newest first), at most `limit`.
pub(crate) async fn jobs_in_state<C: Conn>(
    c: &mut C,
    sql: &Sql,
    state: JobState,
    owner: Option<&OwnerId>,
    oldest: bool,
    limit: i64,
) -> Result<Vec<Job>, StoreError> {
    let statement = match oldest {
        true => &sql.jobs_in_state_oldest,
        false => &sql.jobs_in_state_newest,
    };
    let owner = owner.map_or("", |o| o.0.as_str());
    c.rows(statement, &[Text(state.as_str()), Text(owner), Int(limit)])
        .await?
        .iter()
        .map(|row| job_from(row))
        .collect()
}

/// The owner of a job, whoever it is.
pub(crate) async fn owner_of<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
) -> Result<OwnerId, StoreError> {
    let row = c
        .row(&sql.select_job_owner, &[Text(&job_id.0)])
        .await?
        .ok_or_else(|| StoreError::JobNotFound(job_id.clone()))?;
    Ok(OwnerId(col(&row, 0, "owner_id")?.text("owner_id")?))
}

/// How many jobs are in each state, of `owner` or of every owner.
pub(crate) async fn count_by_state<C: Conn>(
    c: &mut C,
    sql: &Sql,
    owner: Option<&OwnerId>,
) -> Result<Vec<(String, i64)>, StoreError> {
    let owner = owner.map_or("", |o| o.0.as_str());
    c.rows(&sql.count_jobs_by_state, &[Text(owner)])
        .await?
        .iter()
        .map(|row| {
            Ok((
                col(row, 0, "state")?.text("state")?,
                col(row, 1, "n")?.int("n")?,
            ))
        })
        .collect()
}

/// A round trip to the database.
pub(crate) async fn ping<C: Conn>(c: &mut C, sql: &Sql) -> Result<(), StoreError> {
    c.row(&sql.ping, &[]).await?;
    Ok(())
}

pub(crate) async fn count_unknown<C: Conn>(c: &mut C, sql: &Sql) -> Result<i64, StoreError> {
    let row = c
        .row(&sql.count_unknown, &[])
        .await?
        .ok_or_else(|| StoreError::Corrupt("COUNT returned no row".to_owned()))?;
    col(&row, 0, "n")?.int("n")
}

/// The owner's job; another owner's job is not found.
pub(crate) async fn job<C: Conn>(
    c: &mut C,
    sql: &Sql,
    owner: &OwnerId,
    job_id: &JobId,
) -> Result<Job, StoreError> {
    let row = c
        .row(&sql.select_job, &[Text(&job_id.0), Text(&owner.0)])
        .await?
        .ok_or_else(|| StoreError::JobNotFound(job_id.clone()))?;
    job_from(&row)
}

/// The owner's job and its attempts, in order, in one statement.
pub(crate) async fn job_and_attempts<C: Conn>(
    c: &mut C,
    sql: &Sql,
    owner: &OwnerId,
    job_id: &JobId,
) -> Result<(Job, Vec<Attempt>), StoreError> {
    let rows = c
        .rows(
            &sql.select_job_with_attempts,
            &[Text(&job_id.0), Text(&owner.0)],
        )
        .await?;
    job_rows(&rows)?.ok_or_else(|| StoreError::JobNotFound(job_id.clone()))
}

/// A job and its attempts from rows of its columns followed by an
/// attempt's (NULL where there is none): `None` when there is no row.
fn job_rows(rows: &[Vec<Val>]) -> Result<Option<(Job, Vec<Attempt>)>, StoreError> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let job = job_from(&first[..JOB_COLUMNS.min(first.len())])?;
    let attempts = rows
        .iter()
        .map(|row| row.split_at(JOB_COLUMNS.min(row.len())).1)
        // A job without attempts comes as one row with NULL attempt columns.
        .filter(|attempt| attempt.first().is_some_and(|v| *v != Val::Null))
        .map(attempt_from)
        .collect::<Result<_, _>>()?;
    Ok(Some((job, attempts)))
}

/// The races the owner's job has seen, oldest first.
pub(crate) async fn races<C: Conn>(
    c: &mut C,
    sql: &Sql,
    owner: &OwnerId,
    job_id: &JobId,
) -> Result<Vec<Race>, StoreError> {
    job(c, sql, owner, job_id).await?;
    c.rows(&sql.select_races, &[Text(&job_id.0), Text(&owner.0)])
        .await?
        .iter()
        .map(|row| {
            Ok(Race {
                loser_ordinal: col(row, 0, "loser_ordinal")?.int("loser_ordinal")?,
                winner_ordinal: col(row, 1, "winner_ordinal")?.opt_int("winner_ordinal")?,
                reason: col(row, 2, "reason")?.text("reason")?,
                at_ms: col(row, 3, "at_ms")?.int("at_ms")?,
            })
        })
        .collect()
}

struct LockedJob {
    state: JobState,
    hedgeable: bool,
    version: i64,
}

/// Runs `statement` (`lock_job` or `claim_job`) on the owner's job, which
/// takes its row lock, and reads back its state.
async fn lock_job<C: Conn>(
    c: &mut C,
    statement: &str,
    owner: &OwnerId,
    job_id: &JobId,
) -> Result<LockedJob, StoreError> {
    let row = c
        .row(statement, &[Text(&job_id.0), Text(&owner.0)])
        .await?
        .ok_or_else(|| StoreError::JobNotFound(job_id.clone()))?;
    Ok(LockedJob {
        state: parse_job_state(&col(&row, 0, "state")?.text("state")?)?,
        hedgeable: col(&row, 1, "hedgeable")?.int("hedgeable")? == 1,
        version: col(&row, 2, "version")?.int("version")?,
    })
}

/// Locks the job of an attempt the caller already holds, and returns who
/// completed it, if anyone.
async fn lock_job_unscoped<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
) -> Result<Option<i64>, StoreError> {
    let row = c
        .row(&sql.lock_job_unscoped, &[Text(&job_id.0)])
        .await?
        .ok_or_else(|| StoreError::JobNotFound(job_id.clone()))?;
    col(&row, 0, "completed_by")?.opt_int("completed_by")
}

/// Moves an open attempt to a closed state; false when it was not open.
async fn close_attempt<C: Conn>(
    c: &mut C,
    sql: &Sql,
    handle: &AttemptHandle,
    to: AttemptState,
    error: Option<&str>,
    response_id: Option<&str>,
) -> Result<bool, StoreError> {
    let closed = c
        .execute(
            &sql.close_attempt,
            &[
                Text(&handle.job_id.0),
                Int(handle.ordinal),
                Text(to.as_str()),
                OptText(error),
                OptText(response_id),
            ],
        )
        .await?;
    Ok(closed == 1)
}

/// A job that is not over takes its state from its open attempts; with none
/// open it takes `idle`.
async fn settle<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
    idle: JobState,
) -> Result<(), StoreError> {
    c.execute(
        &sql.settle_job_state,
        &[Text(&job_id.0), Text(idle.as_str())],
    )
    .await?;
    Ok(())
}

/// One attempt (of a job the caller may see).
pub(crate) async fn attempt<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
    ordinal: i64,
) -> Result<Attempt, StoreError> {
    let row = c
        .row(&sql.select_attempt, &[Text(&job_id.0), Int(ordinal)])
        .await?
        .ok_or_else(|| StoreError::AttemptNotFound {
            job_id: job_id.clone(),
            ordinal,
        })?;
    attempt_from(&row)
}

/// Why the attempt refused `event` after a guarded update touched no row:
/// it is not in a state that takes the event, or it does not exist.
async fn refused<C: Conn>(
    c: &mut C,
    sql: &Sql,
    job_id: &JobId,
    ordinal: i64,
    event: AttemptEvent,
) -> StoreError {
    match attempt(c, sql, job_id, ordinal).await {
        Ok(attempt) => refusal(attempt.state, event),
        Err(e) => e,
    }
}

/// The typed refusal for an event an attempt in `state` does not accept.
fn refusal(state: AttemptState, event: AttemptEvent) -> StoreError {
    match attempt_after(state, event) {
        Err(e) => StoreError::Transition(e),
        Ok(_) => StoreError::Corrupt(format!(
            "attempt is {state} yet the guarded update touched no row"
        )),
    }
}

pub(crate) fn col<'r>(row: &'r [Val], i: usize, name: &str) -> Result<&'r Val, StoreError> {
    row.get(i)
        .ok_or_else(|| StoreError::Corrupt(format!("no column {i} ({name})")))
}

fn parse_job_state(s: &str) -> Result<JobState, StoreError> {
    JobState::parse(s).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn parse_json(column: &str, text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{column}: {e}")))
}

/// How many columns `sql::JOB_COLUMNS` lists.
const JOB_COLUMNS: usize = 20;

/// How many columns `sql::ATTEMPT_COLUMNS` lists.
const ATTEMPT_WIDTH: usize = 13;

/// A job from a row of `sql::JOB_COLUMNS`, in their order.
fn job_from(row: &[Val]) -> Result<Job, StoreError> {
    let get = |i: usize, name: &str| col(row, i, name);
    let result = get(11, "result")?.opt_text("result")?;
    Ok(Job {
        id: JobId(get(0, "id")?.text("id")?),
        owner: OwnerId(get(1, "owner_id")?.text("owner_id")?),
        key: get(2, "idempotency_key")?.text("idempotency_key")?,
        route: get(3, "route")?.text("route")?,
        contract: get(4, "contract")?.text("contract")?,
        contract_digest: get(5, "contract_digest")?.text("contract_digest")?,
        input: parse_json("input", &get(6, "input")?.text("input")?)?,
        fingerprint: Fingerprint::from_stored(get(7, "fingerprint")?.text("fingerprint")?),
        hedgeable: get(8, "hedgeable")?.int("hedgeable")? == 1,
        state: parse_job_state(&get(9, "state")?.text("state")?)?,
        version: get(10, "version")?.int("version")?,
        result: result.map(|text| parse_json("result", &text)).transpose()?,
        completed_by: get(12, "completed_by")?.opt_int("completed_by")?,
        created_at_ms: get(13, "created_at_ms")?.int("created_at_ms")?,
        updated_at_ms: get(14, "updated_at_ms")?.int("updated_at_ms")?,
        completion: get(15, "completion")?
            .opt_text("completion")?
            .map(|text| parse_json("completion", &text))
            .transpose()?,
        kind: JobKind::parse(&get(16, "kind")?.text("kind")?)
            .ok_or_else(|| StoreError::Corrupt("a job of an unknown kind".to_owned()))?,
        messages: get(17, "messages")?
            .opt_text("messages")?
            .map(|text| parse_json("messages", &text))
            .transpose()?,
        request: get(18, "request")?
            .opt_text("request")?
            .map(|text| parse_json("request", &text))
            .transpose()?,
        deleted_at_ms: get(19, "deleted_at_ms")?.opt_int("deleted_at_ms")?,
    })
}

/// An attempt from a row of `sql::ATTEMPT_COLUMNS`, in their order.
fn attempt_from(row: &[Val]) -> Result<Attempt, StoreError> {
    let get = |i: usize, name: &str| col(row, i, name);
    let slot = get(2, "slot")?.int("slot")?;
    let state = get(4, "state")?.text("state")?;
    Ok(Attempt {
        job_id: JobId(get(0, "job_id")?.text("job_id")?),
        ordinal: get(1, "ordinal")?.int("ordinal")?,
        slot: Slot::from_i64(slot).ok_or_else(|| StoreError::Corrupt(format!("slot {slot}")))?,
        provider: get(3, "provider")?.text("provider")?,
        state: AttemptState::parse(&state).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        base_version: get(5, "base_version")?.int("base_version")?,
        started_at_ms: get(6, "started_at_ms")?.int("started_at_ms")?,
        lease_expires_at_ms: get(7, "lease_expires_at_ms")?.int("lease_expires_at_ms")?,
        unknown_since_ms: get(8, "unknown_since_ms")?.opt_int("unknown_since_ms")?,
        finished_at_ms: get(9, "finished_at_ms")?.opt_int("finished_at_ms")?,
        error: get(10, "error")?.opt_text("error")?,
        provider_response_id: get(11, "provider_response_id")?.opt_text("provider_response_id")?,
        asked_at_ms: get(12, "asked_at_ms")?.opt_int("asked_at_ms")?,
    })
}
