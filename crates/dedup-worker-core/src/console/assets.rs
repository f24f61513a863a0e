//! `/assets/console.js`: the console's one script, compiled in. Every time a page shows is
//! `<time datetime="RFC 3339">… UTC</time>`; the script appends the browser's own local time
//! after each, so the person on call need not convert. Without it (scripts off) the pages are
//! whole and the times UTC alone. Served to anyone (it holds nothing), from this origin only
//! (the CSP's `script-src 'self'`: no inline script runs).

use axum::http::header;
use axum::response::IntoResponse;

/// Appends ` (YYYY-MM-DD HH:MM:SS local, UTC±HH:MM)` after each `time[datetime]`, written
/// out by hand rather than by `toLocaleString`, whose words depend on the browser's language.
pub const CONSOLE_JS: &str = r#""use strict";
(function () {
  function two(n) { return (n < 10 ? "0" : "") + n; }
  document.querySelectorAll("time[datetime]").forEach(function (time) {
    var at = new Date(time.getAttribute("datetime"));
    if (isNaN(at.getTime())) { return; }
    var offset = -at.getTimezoneOffset();
    var sign = offset < 0 ? "-" : "+";
    offset = Math.abs(offset);
    var local = document.createElement("span");
    local.className = "local";
    local.textContent = " (" + at.getFullYear() + "-" + two(at.getMonth() + 1) + "-" +
      two(at.getDate()) + " " + two(at.getHours()) + ":" + two(at.getMinutes()) + ":" +
      two(at.getSeconds()) + " local, UTC" + sign + two(Math.floor(offset / 60)) + ":" +
      two(offset % 60) + ")";
    time.after(local);
  });
})();
"#;

/// `GET /assets/console.js`.
pub async fn console_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        CONSOLE_JS,
    )
}
