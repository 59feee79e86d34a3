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
/// The budget is this replica's: each replica of a deployment spends its own.
#[derive(Debug, Default)]
pub struct Budgets {
    routes: Mutex<HashMap<String, RouteBudget>>,
}

#[derive(Debug)]
struct RouteBudget {
    since: Instant,
    hourly: u32,
    /// Calls spent this hour, by provider.
    used: HashMap<String, u32>,
    in_flight: Arc<Semaphore>,
}

impl RouteBudget {
    /// The hour's calls, counted afresh once the hour is over.
    fn this_hour(&mut self) -> &mut HashMap<String, u32> {
        if self.since.elapsed() >= BUDGET_PERIOD {
            self.since = Instant::now();
            self.used.clear();
        }
        &mut self.used
    }
}

/// What one provider spent of a route's budget this hour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spent {
    pub route: String,
    pub provider: String,
    pub calls: u32,
    /// The route's calls per hour.
    pub hourly: u32,
}

impl Spent {
    /// The share of the route's hourly budget this provider spent.
    pub fn share(&self) -> f64 {
        f64::from(self.calls) / f64::from(self.hourly.max(1))
    }
}

impl Budgets {
    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<String, RouteBudget>> {
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One call of `route`'s budget for `provider`, if any is left this
    /// hour; with it, the route's concurrency cap to wait on.
    pub fn take(&self, route: &str, provider: &str, shadow: &Shadow) -> Option<Arc<Semaphore>> {
        let mut routes = self.routes();
        let budget = routes
            .entry(route.to_owned())
            .or_insert_with(|| RouteBudget {
                since: Instant::now(),
                hourly: shadow.hourly_budget,
                used: HashMap::new(),
                in_flight: Arc::new(Semaphore::new(shadow.max_concurrent as usize)),
            });
        let used = budget.this_hour();
        if used.values().sum::<u32>() >= shadow.hourly_budget {
            return None;
        }
        *used.entry(provider.to_owned()).or_default() += 1;
        Some(budget.in_flight.clone())
    }

    /// The calls of `route`'s budget spent this hour.
    pub fn used(&self, route: &str) -> u32 {
        self.routes()
            .get_mut(route)
            .map_or(0, |b| b.this_hour().values().sum())
    }

    /// What each provider spent of each route's budget this hour.
    pub fn spent(&self) -> Vec<Spent> {
        let mut routes = self.routes();
        let mut spent = Vec::new();
        for (route, budget) in routes.iter_mut() {
            let hourly = budget.hourly;
            for (provider, calls) in budget.this_hour() {
                spent.push(Spent {
                    route: route.clone(),
                    provider: provider.clone(),
                    calls: *calls,
                    hourly,
                });
            }
        }
        spent
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
