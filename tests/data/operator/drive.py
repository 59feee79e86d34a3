"""Drives the operator's pages in Debian's chromium through Playwright, as an
on-call engineer would, and prints what it saw as JSON. The Rust test
(`tests/router/operator.rs`) sets the scene and judges."""

import json
import os

from playwright.sync_api import sync_playwright

base = os.environ["BASE_URL"]
unknown_job = os.environ["UNKNOWN_JOB"]
failed_job = os.environ["FAILED_JOB"]
other_job = os.environ["OTHER_JOB"]
shots = os.environ["SHOTS"]
seen = {}


def injected(page):
    """What an answer's markup would have left, had it been markup."""
    return {
        "scripts": page.locator("script").count(),
        "images": page.locator("img").count(),
        "pwned": page.evaluate("document.body.dataset.pwned || ''"),
    }


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ["CHROMIUM"], args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1280, "height": 900})

    # A key that is not an admin's cannot sign in.
    page.goto(base + "/ui")
    page.fill("input[name=key]", os.environ["USER_KEY"])
    page.click("button")
    seen["user_refused"] = page.locator("[role=alert]").inner_text()

    # An admin signs in and sees the queue.
    page.fill("input[name=key]", os.environ["ADMIN_KEY"])
    page.click("button")
    page.wait_for_url(base + "/ui")
    seen["queue_unknown"] = page.locator(f"#unknown a[href='/ui/jobs/{unknown_job}']").count()
    seen["queue_failed"] = page.locator(f"#failed a[href='/ui/jobs/{failed_job}']").count()
    seen["queue_other_owner"] = page.locator(f"a[href='/ui/jobs/{other_job}']").count()
    seen["queue_injected"] = injected(page)
    page.screenshot(path=f"{shots}/queue.png", full_page=True)

    # The failed job's page shows the answer's words as text.
    page.goto(f"{base}/ui/jobs/{failed_job}")
    seen["failed_error"] = page.locator("#attempts tbody tr").first.inner_text()
    seen["failed_injected"] = injected(page)

    # Open the unknown job, cancel its attempt (with the confirmation).
    page.goto(base + "/ui")
    page.click(f"#unknown a[href='/ui/jobs/{unknown_job}']")
    seen["job_state"] = page.locator("h1 .state").inner_text()
    page.click("a.action")
    confirm = page.url
    seen["confirm_title"] = page.locator("h1").inner_text()
    # A form without the session's token is refused.
    page.evaluate("document.querySelector('main form input[name=csrf]').remove()")
    with page.expect_navigation() as nav:
        page.click("button[name=confirm]")
    seen["forged_status"] = nav.value.status
    page.goto(confirm)
    with page.expect_navigation():
        page.click("button[name=confirm]")
    seen["after_cancel_url"] = page.url
    seen["after_cancel"] = page.locator("#attempts tbody tr").first.inner_text()

    # Retry it; the page waits for the outcome.
    page.click("text=Retry this job")
    page.click("button[name=confirm]")
    page.wait_for_url(f"{base}/ui/jobs/{unknown_job}?wait=10")
    seen["after_retry"] = page.locator("h1 .state").inner_text()
    seen["answer"] = page.locator("#answer").inner_text()
    page.screenshot(path=f"{shots}/job.png", full_page=True)

    page.goto(base + "/ui/certification")
    seen["matrix"] = page.locator("#matrix").inner_text()
    page.screenshot(path=f"{shots}/certification.png", full_page=True)
    seen["matrix_demoted"] = page.locator("#matrix tr", has_text="fake-b").inner_text()

    # The demoted provider's live results, then its reinstate (confirmed).
    page.click("#matrix a[href='/ui/certification/fake-b/language-detect']")
    seen["live_results"] = page.locator("#live").inner_text()
    seen["live_injected"] = injected(page)
    page.screenshot(path=f"{shots}/live.png", full_page=True)
    page.click("text=Reinstate fake-b for language-detect")
    reinstate = page.url
    seen["reinstate_title"] = page.locator("h1").inner_text()
    # Without a reason the browser does not send the form.
    page.click("button[name=confirm]")
    seen["reinstate_without_reason"] = page.url
    page.fill("textarea[name=reason]", "checked its answers by hand")
    page.evaluate("document.querySelector('main form input[name=csrf]').remove()")
    with page.expect_navigation() as nav:
        page.click("button[name=confirm]")
    seen["reinstate_forged_status"] = nav.value.status
    page.goto(reinstate)
    page.fill("textarea[name=reason]", "checked its answers by hand")
    with page.expect_navigation():
        page.click("button[name=confirm]")
    seen["after_reinstate"] = page.locator("main .state").first.inner_text()
    page.goto(base + "/ui/certification")
    cookies = page.context.cookies()

    # Reading works with JavaScript off.
    off = browser.new_context(java_script_enabled=False)
    off.add_cookies(cookies)
    reader = off.new_page()
    reader.goto(f"{base}/ui/jobs/{unknown_job}")
    seen["no_js_state"] = reader.locator("h1 .state").inner_text()
    browser.close()

print(json.dumps(seen))
