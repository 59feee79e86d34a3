//! One small interface over both engines' connections, so every store
//! operation is written once (`ops.rs`) and runs on either.
//!
//! Rows come back as owned values by position: every statement that returns
//! a job or an attempt lists the columns of `sql.rs` in their fixed order.
//! The SQLite side never suspends (rusqlite is synchronous); [`ready`] runs
//! such a future to its end on the calling thread.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use sqlx::postgres::PgRow;
use sqlx::{Column, PgConnection, Row, TypeInfo, ValueRef};

use crate::StoreError;

/// A bound parameter. The arrays are PostgreSQL's alone: they carry a
/// column of a batch (`unnest`), which SQLite's statements never take.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param<'a> {
    Text(&'a str),
    OptText(Option<&'a str>),
    Int(i64),
    Texts(&'a [&'a str]),
    OptTexts(&'a [Option<&'a str>]),
    Ints(&'a [i64]),
}

/// A column's value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Null,
    Int(i64),
    Text(String),
}

/// A row: its values in the statement's column order.
pub(crate) type Values = Vec<Val>;

impl Val {
    pub(crate) fn int(&self, column: &str) -> Result<i64, StoreError> {
        match self {
            Val::Int(n) => Ok(*n),
            other => Err(corrupt(column, "an integer", other)),
        }
    }

    pub(crate) fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        match self {
            Val::Null => Ok(None),
            other => other.int(column).map(Some),
        }
    }

    pub(crate) fn text(&self, column: &str) -> Result<String, StoreError> {
        match self {
            Val::Text(s) => Ok(s.clone()),
            other => Err(corrupt(column, "text", other)),
        }
    }

    /// Whether this is the text `s`.
    pub(crate) fn is_text(&self, s: &str) -> bool {
        matches!(self, Val::Text(t) if t == s)
    }

    pub(crate) fn opt_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        match self {
            Val::Null => Ok(None),
            other => other.text(column).map(Some),
        }
    }
}

fn corrupt(column: &str, expected: &str, found: &Val) -> StoreError {
    StoreError::Corrupt(format!("{column}: expected {expected}, found {found:?}"))
}

/// What the operations need of a connection: run a statement, read its rows.
pub(crate) trait Conn {
    /// The first row the statement returns, if any; the rest are not read.
    async fn row(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Values>, StoreError>;
    async fn rows(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Values>, StoreError>;
    /// Runs the statement and returns how many rows it changed.
    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError>;
}

// ---- PostgreSQL, through sqlx ----

fn pg_query<'q>(
    sql: &'q str,
    params: &[Param<'q>],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    // Every statement is kept prepared, and PostgreSQL may keep one plan
    // for it as long as the connection lives, made while the tables were
    // empty: the batched statements reach each job by an index lookup of
    // its own whatever the tables hold (`sql.rs`), so that plan stays good.
    let mut query = sqlx::query(sql);
    for param in params {
        query = match *param {
            Param::Text(s) => query.bind(s),
            Param::OptText(s) => query.bind(s),
            Param::Int(n) => query.bind(n),
            Param::Texts(a) => query.bind(a),
            Param::OptTexts(a) => query.bind(a),
            Param::Ints(a) => query.bind(a),
        };
    }
    query
}

fn pg_values(row: &PgRow) -> Result<Values, StoreError> {
    let mut values = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let raw = row.try_get_raw(i)?;
        let value = if raw.is_null() {
            Val::Null
        } else {
            match column.type_info().name() {
                "INT8" | "INT4" | "INT2" => Val::Int(row.try_get::<i64, _>(i)?),
                _ => Val::Text(row.try_get::<String, _>(i)?),
            }
        };
        values.push(value);
    }
    Ok(values)
}

impl Conn for PgConnection {
    async fn row(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Values>, StoreError> {
        let row = pg_query(sql, params).fetch_optional(&mut *self).await?;
        row.as_ref().map(pg_values).transpose()
    }

    async fn rows(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Values>, StoreError> {
        let rows = pg_query(sql, params).fetch_all(&mut *self).await?;
        rows.iter().map(pg_values).collect()
    }

    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        Ok(pg_query(sql, params)
            .execute(&mut *self)
            .await?
            .rows_affected())
    }
}

// ---- SQLite, through rusqlite ----

/// A rusqlite connection seen through [`Conn`]; statements are prepared once
/// per connection and cached.
#[derive(Debug)]
pub(crate) struct Lite<'c>(pub(crate) &'c rusqlite::Connection);

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, Value, ValueRef};
        Ok(match *self {
            Param::Text(s) | Param::OptText(Some(s)) => {
                ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes()))
            }
            Param::OptText(None) => ToSqlOutput::Borrowed(ValueRef::Null),
            Param::Int(n) => ToSqlOutput::Owned(Value::Integer(n)),
            Param::Texts(_) | Param::OptTexts(_) | Param::Ints(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    "SQLite takes no array parameter; batches are PostgreSQL's".into(),
                ));
            }
        })
    }
}

fn lite_values(row: &rusqlite::Row<'_>, columns: usize) -> Result<Values, StoreError> {
    use rusqlite::types::ValueRef as V;
    (0..columns)
        .map(|i| {
            Ok(match row.get_ref(i)? {
                V::Null => Val::Null,
                V::Integer(n) => Val::Int(n),
                V::Text(bytes) => Val::Text(
                    String::from_utf8(bytes.to_vec())
                        .map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))?,
                ),
                V::Real(_) | V::Blob(_) => {
                    return Err(StoreError::Corrupt(format!(
                        "column {i}: unexpected real or blob"
                    )));
                }
            })
        })
        .collect()
}

impl Lite<'_> {
    fn collect(
        &self,
        sql: &str,
        params: &[Param<'_>],
        limit: usize,
    ) -> Result<Vec<Values>, StoreError> {
        let mut statement = self.0.prepare_cached(sql)?;
        let columns = statement.column_count();
        let mut rows = statement.query(rusqlite::params_from_iter(params))?;
        let mut out = Vec::new();
        while out.len() < limit {
            match rows.next()? {
                Some(row) => out.push(lite_values(row, columns)?),
                None => break,
            }
        }
        Ok(out)
    }
}

impl Conn for Lite<'_> {
    async fn row(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Values>, StoreError> {
        Ok(self.collect(sql, params, 1)?.pop())
    }

    async fn rows(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Values>, StoreError> {
        self.collect(sql, params, usize::MAX)
    }

    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        let mut statement = self.0.prepare_cached(sql)?;
        let changed = statement.execute(rusqlite::params_from_iter(params))?;
        Ok(changed as u64)
    }
}

/// Runs a future that never suspends (an operation on a [`Lite`]) to its end.
pub(crate) fn ready<T>(
    future: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => Err(StoreError::Corrupt(
            "a SQLite operation suspended; it must run synchronously".to_owned(),
        )),
    }
}
