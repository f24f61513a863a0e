//! The login page: the one page shown without the token (and, with 401, to a browser that
//! asked for another page without it).

use axum::extract::Query;
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

use super::style::STYLE;

/// The login page (also what an unauthenticated browser gets, with 401).
pub fn login_page(next: &str, error: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Log in · dedup-worker" }
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                main {
                    h1 { "dedup-worker console" }
                    @if let Some(error) = error { p.error { (error) } }
                    form #login method="post" action="/login" {
                        fieldset {
                            p { label { "Token (admin.token) " input type="password" name="token" autocomplete="current-password" required autofocus; } }
                            p { label { "Your name, for the record of actions (optional) " input type="text" name="name" maxlength="64"; } }
                            input type="hidden" name="next" value=(next);
                            button type="submit" { "Log in" }
                        }
                    }
                }
            }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct LoginQuery {
    #[serde(default)]
    next: String,
}

/// `GET /login`.
pub async fn login(Query(query): Query<LoginQuery>) -> Markup {
    login_page(safe_next(&query.next), None)
}

/// Where to go after logging in: a path of this console only (never `//host` or a URL).
///
/// Browsers drop tabs and line breaks from a URL, so `/\t/evil.example` would become
/// `//evil.example`, another host: any control character, space or backslash refuses it, and
/// the second character may not be `/`.
pub fn safe_next(next: &str) -> &str {
    let plain = !next
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == '\\');
    if plain && next.starts_with('/') && !next.starts_with("//") {
        next
    } else {
        "/"
    }
}

#[cfg(test)]
mod tests {
    use super::safe_next;

    #[test]
    fn next_is_a_path_of_this_console_or_the_front_page() {
        for ok in [
            "/",
            "/events?type=invoice.&after=1.handled.i2",
            "/events/stripe/evt_1",
        ] {
            assert_eq!(safe_next(ok), ok);
        }
        for bad in [
            "//evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/\\evil.example",
            "/\r//evil.example",
            "https://evil.example",
            "evil",
            "",
            "/ /x",
            "/\u{0}/x",
        ] {
            assert_eq!(safe_next(bad), "/", "{bad:?}");
        }
    }
}
