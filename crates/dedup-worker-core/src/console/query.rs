//! The console's query strings and forms: a filter as a person types it (a type prefix, times
//! in several forms), read into what the listings and actions take.

use serde::Deserialize;

use crate::event::{check_event_field, EventField, InvalidEventField, MAX_EVENT_FIELD_BYTES};
use crate::inspect::{EventQuery, OutcomeFilter};
use crate::operator::RowFilter;

/// Rows per page of every list.
pub const PAGE: i64 = 50;

/// The fields every filter form has (all optional, empty meaning "any").
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FilterForm {
    #[serde(default)]
    pub id: String,
    #[serde(default, rename = "type")]
    pub type_prefix: String,
    /// One source's events (`/events` only); empty: every source.
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub since: String,
    #[serde(default)]
    pub until: String,
    #[serde(default)]
    pub outcome: String,
    /// Events of this customer (`/events` only: the kept bodies' `customer`).
    #[serde(default)]
    pub customer: String,
    /// Events about this object id (`/events` only: the kept bodies' `object_id`).
    #[serde(default)]
    pub object: String,
    /// The next page's cursor (events) or the last row's id (lists).
    #[serde(default)]
    pub after: String,
    /// The cursor of a page of newer events ("← Newer" on `/events`).
    #[serde(default)]
    pub before: String,
    /// Set by a bulk action's confirmation.
    #[serde(default)]
    pub confirm: String,
    /// One row's id (an event page's action).
    #[serde(default)]
    pub row: String,
    /// The recorded action a page reports done (`admin_actions.id`), after an action's redirect.
    #[serde(default)]
    pub done: String,
}

/// A filter field a person got wrong, with what was typed.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct BadFilter {
    pub field: &'static str,
    pub reason: String,
}

impl FilterForm {
    /// Every text field by the ingress's rule for ids, types and sources
    /// ([`check_event_field`]): at most [`MAX_EVENT_FIELD_BYTES`] bytes, no control character.
    /// Nothing longer can be stored, and a NUL cannot even be sent to PostgreSQL (it answers
    /// "invalid byte sequence", which would be a 503 for a typing mistake).
    pub fn check(&self) -> Result<(), BadFilter> {
        let fields = [
            ("id", &self.id),
            ("type", &self.type_prefix),
            ("source", &self.source),
            ("since", &self.since),
            ("until", &self.until),
            ("outcome", &self.outcome),
            ("customer", &self.customer),
            ("object", &self.object),
            ("after", &self.after),
            ("before", &self.before),
            ("confirm", &self.confirm),
            ("row", &self.row),
            ("done", &self.done),
        ];
        for (field, value) in fields {
            check_text(field, value)?;
        }
        Ok(())
    }

    pub fn since_ms(&self) -> Result<Option<i64>, BadFilter> {
        parse_time_ms("since", &self.since)
    }

    pub fn until_ms(&self) -> Result<Option<i64>, BadFilter> {
        parse_time_ms("until", &self.until)
    }

    pub fn type_prefix(&self) -> Option<String> {
        let prefix = self.type_prefix.trim();
        (!prefix.is_empty()).then(|| prefix.to_owned())
    }

    /// The filter of a bulk action or a list.
    pub fn rows(&self) -> Result<RowFilter, BadFilter> {
        self.check()?;
        Ok(RowFilter {
            type_prefix: self.type_prefix(),
            since_ms: self.since_ms()?,
            until_ms: self.until_ms()?,
            ids: Vec::new(),
        })
    }

    /// An `/events` search.
    pub fn events(&self) -> Result<EventQuery, BadFilter> {
        self.check()?;
        let outcome = OutcomeFilter::parse(self.outcome.trim()).ok_or_else(|| BadFilter {
            field: "outcome",
            reason: format!(
                "{:?} is not one of {}",
                self.outcome,
                OutcomeFilter::NAMES.join(", ")
            ),
        })?;
        Ok(EventQuery {
            id: Some(self.id.trim().to_owned()).filter(|id| !id.is_empty()),
            type_prefix: self.type_prefix(),
            source: Some(self.source.trim().to_owned()).filter(|s| !s.is_empty()),
            since_ms: self.since_ms()?,
            until_ms: self.until_ms()?,
            customer: Some(self.customer.trim().to_owned()).filter(|c| !c.is_empty()),
            object: Some(self.object.trim().to_owned()).filter(|o| !o.is_empty()),
            outcome,
            cursor: Some(self.after.clone()).filter(|c| !c.is_empty()),
            before: Some(self.before.clone()).filter(|c| !c.is_empty()),
            limit: PAGE,
        })
    }

    /// `after` as a row id (the lists' keyset).
    pub fn before_id(&self) -> Option<i64> {
        self.after.trim().parse().ok()
    }

    /// The query string of this filter (for links and hidden fields), without the page.
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        [
            ("id", self.id.as_str()),
            ("type", self.type_prefix.as_str()),
            ("source", self.source.as_str()),
            ("since", self.since.as_str()),
            ("until", self.until.as_str()),
            ("outcome", self.outcome.as_str()),
            ("customer", self.customer.as_str()),
            ("object", self.object.as_str()),
            ("row", self.row.as_str()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect()
    }

    /// The query string of this filter, then the page (`after`) and the action to report done.
    pub fn query_string(&self, after: Option<&str>, done: Option<i64>) -> String {
        self.page_query_string(after.map(|a| ("after", a)), done)
    }

    /// The query string of this filter, then a page (`("after", cursor)` for older rows,
    /// `("before", cursor)` for newer) and the action to report done.
    pub fn page_query_string(&self, page: Option<(&str, &str)>, done: Option<i64>) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (k, v) in self.pairs() {
            query.append_pair(k, v);
        }
        if let Some((name, cursor)) = page {
            query.append_pair(name, cursor);
        }
        if let Some(done) = done {
            query.append_pair("done", &done.to_string());
        }
        query.finish()
    }
}

/// One field of a form by [`check_event_field`]'s rule (an empty field is "any"), its refusal
/// naming the form's field rather than an event's.
pub fn check_text(field: &'static str, value: &str) -> Result<(), BadFilter> {
    let reason = match check_event_field(EventField::Type, value) {
        Ok(()) => return Ok(()),
        Err(InvalidEventField::TooLong { len, .. }) => {
            format!("{len} bytes long; at most {MAX_EVENT_FIELD_BYTES} bytes are accepted")
        }
        Err(InvalidEventField::ControlCharacter { code, at, .. }) => {
            format!("contains the control character U+{code:04X} at byte {at}; type printable text")
        }
        // The type's rule takes an empty value.
        Err(InvalidEventField::Empty { .. }) => return Ok(()),
    };
    Err(BadFilter { field, reason })
}

/// 9999-12-31T23:59:59Z.
const LATEST_SECS: i64 = 253_402_300_799;

/// A time as typed: RFC 3339, a browser's `datetime-local` (`2026-12-04T10:00`, read as UTC),
/// a date (UTC midnight) or Unix seconds; empty is none.
pub fn parse_time_ms(field: &'static str, text: &str) -> Result<Option<i64>, BadFilter> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    if let Ok(secs) = text.parse::<i64>() {
        // Years 1970 to 9999: beyond them PostgreSQL's timestamps overflow (a 503, not a 400).
        if !(0..=LATEST_SECS).contains(&secs) {
            return Err(BadFilter {
                field,
                reason: format!("{text} is not a time between 1970 and 9999 in Unix seconds"),
            });
        }
        return Ok(Some(secs * 1000));
    }
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(Some(at.timestamp_millis()));
    }
    for format in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"] {
        if let Ok(at) = chrono::NaiveDateTime::parse_from_str(text, format) {
            return Ok(Some(at.and_utc().timestamp_millis()));
        }
    }
    if let Ok(day) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        let midnight = day.and_hms_opt(0, 0, 0).expect("midnight exists");
        return Ok(Some(midnight.and_utc().timestamp_millis()));
    }
    Err(BadFilter {
        field,
        reason: format!(
            "{text:?} is not a time (2026-12-04T10:00:00Z, 2026-12-04T10:00, 2026-12-04 or Unix seconds)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_in_each_form_a_person_types() {
        let at = |t| parse_time_ms("since", t).unwrap();
        assert_eq!(at(""), None);
        assert_eq!(at("1796119200"), Some(1_796_119_200_000));
        assert_eq!(at("2026-12-01T10:00:00Z"), Some(1_796_119_200_000));
        assert_eq!(at("2026-12-01T11:00:00+01:00"), Some(1_796_119_200_000));
        assert_eq!(at("2026-12-01T10:00"), Some(1_796_119_200_000));
        assert_eq!(at("2026-12-01"), Some(1_796_083_200_000));
        assert!(parse_time_ms("since", "yesterday").is_err());
        assert!(parse_time_ms("since", "99999999999999").is_err());
        assert!(parse_time_ms("since", "-1").is_err());
    }

    /// One field of a form, to be set.
    type FieldOf = fn(&mut FilterForm) -> &mut String;

    #[test]
    fn a_control_character_or_an_over_long_value_in_any_field_is_refused_by_name() {
        let long = "a".repeat(MAX_EVENT_FIELD_BYTES + 1);
        let fields: [(&str, FieldOf); 13] = [
            ("id", |f| &mut f.id),
            ("type", |f| &mut f.type_prefix),
            ("source", |f| &mut f.source),
            ("since", |f| &mut f.since),
            ("until", |f| &mut f.until),
            ("outcome", |f| &mut f.outcome),
            ("customer", |f| &mut f.customer),
            ("object", |f| &mut f.object),
            ("after", |f| &mut f.after),
            ("before", |f| &mut f.before),
            ("confirm", |f| &mut f.confirm),
            ("row", |f| &mut f.row),
            ("done", |f| &mut f.done),
        ];
        for (name, field) in fields {
            for bad in ["a\0b", "\u{1b}[31m", long.as_str()] {
                let mut form = FilterForm::default();
                *field(&mut form) = bad.to_owned();
                let refused = form.check().expect_err(name);
                assert_eq!(refused.field, name);
            }
            let mut form = FilterForm::default();
            *field(&mut form) = "a".repeat(MAX_EVENT_FIELD_BYTES);
            assert!(form.check().is_ok(), "{name} at the limit");
        }
    }
}
