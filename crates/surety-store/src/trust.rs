//! The router's own checks and the trust they take away, written once for
//! both engines: live results (shadow calls and scheduled re-checks) and
//! demotions. A demotion is opened by an insert the partial unique index
//! `demotions_one_open` decides (two replicas deciding it at once record it
//! once), and closed by one guarded update whose changed-row count says
//! whether it was open.

use serde_json::Value;

use crate::StoreError;
use crate::conn::{Conn, Param::*, Values};
use crate::model::{Demotion, JobId, Lift, LiveOutcome, LiveResult, LiveSource, LiveVerdict};
use crate::ops::col;
use crate::sql::Sql;

fn json_text(value: Option<&Value>) -> Option<String> {
    value.map(Value::to_string)
}

/// Records `result` (its `at_ms` is the database's clock). A live result
/// is an observation: on PostgreSQL its commit does not wait for the WAL
/// flush (a crash may lose the last few, which the next checks observe
/// again); the demotion it may lead to is committed durably on its own.
pub(crate) async fn record_live<C: Conn>(
    c: &mut C,
    sql: &Sql,
    result: &LiveResult,
) -> Result<(), StoreError> {
    if let Some(relaxed) = &sql.relaxed_commit {
        c.execute(relaxed, &[]).await?;
    }
    let id = uuid::Uuid::now_v7().to_string();
    let input = result.input.to_string();
    let (expected, answer) = (
        json_text(result.expected.as_ref()),
        json_text(result.answer.as_ref()),
    );
    c.execute(
        &sql.insert_live_result,
        &[
            Text(&id),
            Text(&result.provider),
            Text(&result.contract),
            Text(&result.route),
            Text(result.source.as_str()),
            Text(result.outcome.as_str()),
            Text(&result.detail),
            OptText(result.job_id.as_ref().map(|j| j.0.as_str())),
            OptText(result.case_name.as_deref()),
            Text(&input),
            OptText(expected.as_deref()),
            OptText(answer.as_deref()),
        ],
    )
    .await?;
    Ok(())
}

fn json(row: &Values, i: usize, name: &str) -> Result<Option<Value>, StoreError> {
    col(row, i, name)?
        .opt_text(name)?
        .map(|text| {
            serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(format!("{name}: {e}")))
        })
        .transpose()
}

/// The source, outcome and detail at columns `at`, `at + 1`, `at + 2`.
fn verdict_from(row: &Values, at: usize) -> Result<LiveVerdict, StoreError> {
    let word = |i: usize, name: &str| col(row, i, name)?.text(name);
    let source = word(at, "source")?;
    let outcome = word(at + 1, "outcome")?;
    Ok(LiveVerdict {
        source: LiveSource::parse(&source)
            .ok_or_else(|| StoreError::Corrupt(format!("source: `{source}`")))?,
        outcome: LiveOutcome::parse(&outcome)
            .ok_or_else(|| StoreError::Corrupt(format!("outcome: `{outcome}`")))?,
        detail: word(at + 2, "detail")?,
    })
}

/// The newest `n` verdicts of `provider` on `contract`, newest first.
pub(crate) async fn live_verdicts<C: Conn>(
    c: &mut C,
    sql: &Sql,
    provider: &str,
    contract: &str,
    n: i64,
) -> Result<Vec<LiveVerdict>, StoreError> {
    let params = [Text(provider), Text(contract), Int(n)];
    c.rows(&sql.select_live_verdicts, &params)
        .await?
        .iter()
        .map(|row| verdict_from(row, 0))
        .collect()
}

fn live_from(row: &Values) -> Result<LiveResult, StoreError> {
    let word = |i: usize, name: &str| col(row, i, name)?.text(name);
    let LiveVerdict {
        source,
        outcome,
        detail,
    } = verdict_from(row, 3)?;
    Ok(LiveResult {
        provider: word(0, "provider")?,
        contract: word(1, "contract")?,
        route: word(2, "route")?,
        source,
        outcome,
        detail,
        job_id: col(row, 6, "job_id")?.opt_text("job_id")?.map(JobId),
        case_name: col(row, 7, "case_name")?.opt_text("case_name")?,
        input: json(row, 8, "input")?.unwrap_or(Value::Null),
        expected: json(row, 9, "expected")?,
        answer: json(row, 10, "answer")?,
        at_ms: col(row, 11, "at_ms")?.int("at_ms")?,
    })
}

/// Which live results to read.
pub(crate) enum LiveQuery<'a> {
    /// The newest `n` of `provider` on `contract`, newest first.
    Window {
        provider: &'a str,
        contract: &'a str,
        n: i64,
    },
    /// Route `route`'s since `since_ms` with `outcome` (with `None`: those
    /// that broke the contract or disagreed), oldest first.
    Route {
        route: &'a str,
        since_ms: i64,
        outcome: Option<LiveOutcome>,
    },
}

/// The live results `query` names.
pub(crate) async fn live<C: Conn>(
    c: &mut C,
    sql: &Sql,
    query: &LiveQuery<'_>,
) -> Result<Vec<LiveResult>, StoreError> {
    let rows = match *query {
        LiveQuery::Window {
            provider,
            contract,
            n,
        } => {
            let params = [Text(provider), Text(contract), Int(n)];
            c.rows(&sql.select_live_window, &params).await?
        }
        LiveQuery::Route {
            route,
            since_ms,
            outcome,
        } => {
            let outcome = outcome.map_or("", LiveOutcome::as_str);
            let params = [Text(route), Int(since_ms), Text(outcome)];
            c.rows(&sql.select_live_results, &params).await?
        }
    };
    rows.iter().map(live_from).collect()
}

/// Demotes `provider` for `contract` for `reason`, unless it is demoted
/// already; true when this call demoted it.
pub(crate) async fn demote<C: Conn>(
    c: &mut C,
    sql: &Sql,
    provider: &str,
    contract: &str,
    reason: &str,
) -> Result<bool, StoreError> {
    let id = uuid::Uuid::now_v7().to_string();
    let inserted = c
        .execute(
            &sql.insert_demotion,
            &[Text(&id), Text(provider), Text(contract), Text(reason)],
        )
        .await?;
    Ok(inserted == 1)
}

/// Every open demotion, by provider and contract.
pub(crate) async fn demotions<C: Conn>(c: &mut C, sql: &Sql) -> Result<Vec<Demotion>, StoreError> {
    c.rows(&sql.select_demotions, &[])
        .await?
        .iter()
        .map(|row| {
            Ok(Demotion {
                provider: col(row, 0, "provider")?.text("provider")?,
                contract: col(row, 1, "contract")?.text("contract")?,
                reason: col(row, 2, "reason")?.text("reason")?,
                demoted_at_ms: col(row, 3, "demoted_at_ms")?.int("demoted_at_ms")?,
            })
        })
        .collect()
}

/// Lifts the open demotion of `provider` for `contract` as `lift` allows;
/// true when one was open and is lifted now.
pub(crate) async fn lift<C: Conn>(
    c: &mut C,
    sql: &Sql,
    provider: &str,
    contract: &str,
    lift: &Lift,
) -> Result<bool, StoreError> {
    let (by, why, before) = match lift {
        Lift::Certification { certified_at_ms } => (
            "certification".to_owned(),
            "a certification newer than the demotion".to_owned(),
            *certified_at_ms,
        ),
        Lift::Admin { by, why } => (by.clone(), why.clone(), i64::MAX),
    };
    let lifted = c
        .execute(
            &sql.lift_demotion,
            &[
                Text(provider),
                Text(contract),
                Text(&by),
                Text(&why),
                Int(before),
            ],
        )
        .await?;
    Ok(lifted == 1)
}
