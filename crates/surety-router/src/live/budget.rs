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
