//! Each route's budget for the router's own checks (calls per hour) and its
//! concurrency cap, as this router spends them. Below the shared state, so
//! the state can hold them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use surety_config::Shadow;
use tokio::sync::Semaphore;

/// How long a route's budget lasts before it is counted afresh.
const BUDGET_PERIOD: Duration = Duration::from_secs(3600);

/// Each route's budget and concurrency cap, as this router spends them.
#[derive(Debug, Default)]
pub struct Budgets {
    routes: Mutex<HashMap<String, RouteBudget>>,
}

#[derive(Debug)]
struct RouteBudget {
    since: Instant,
    used: u32,
    in_flight: Arc<Semaphore>,
}

impl Budgets {
    /// One call of `route`'s budget, if any is left this hour; with it, the
    /// route's concurrency cap to wait on.
    pub fn take(&self, route: &str, shadow: &Shadow) -> Option<Arc<Semaphore>> {
        let mut routes = self
            .routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let budget = routes
            .entry(route.to_owned())
            .or_insert_with(|| RouteBudget {
                since: Instant::now(),
                used: 0,
                in_flight: Arc::new(Semaphore::new(shadow.max_concurrent as usize)),
            });
        if budget.since.elapsed() >= BUDGET_PERIOD {
            (budget.since, budget.used) = (Instant::now(), 0);
        }
        if budget.used >= shadow.hourly_budget {
            return None;
        }
        budget.used += 1;
        Some(budget.in_flight.clone())
    }

    /// The calls of `route`'s budget spent this hour.
    pub fn used(&self, route: &str) -> u32 {
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(route)
            .map_or(0, |b| b.used)
    }
}

/// When each route's next scheduled re-check is due, and which of its
/// (provider, case) pairs it is: the pairs are spread over the route's
/// interval, one at a time.
#[derive(Debug, Default)]
pub struct Rechecks {
    routes: Mutex<HashMap<String, (Instant, usize)>>,
}

impl Rechecks {
    /// The pair due now for `route`, if one is (its place in `0..pairs`),
    /// and schedules the next one `every / pairs` later.
    pub fn due(&self, route: &str, every: Duration, pairs: usize) -> Option<usize> {
        if pairs == 0 {
            return None;
        }
        let mut routes = self
            .routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let (next, slot) = routes.entry(route.to_owned()).or_insert((now, 0));
        if now < *next {
            return None;
        }
        let due = *slot % pairs;
        let gap = every / u32::try_from(pairs).unwrap_or(u32::MAX);
        (*next, *slot) = (now + gap, due + 1);
        Some(due)
    }
}
