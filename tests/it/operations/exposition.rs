//! Reading a Prometheus text exposition (what `/metrics` serves): its samples with their
//! labels, and the `# TYPE` of each metric family.

use std::collections::{BTreeMap, BTreeSet};

/// One sample line: `name{label="value",…} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    /// Family name to its type (`counter`, `gauge`, `histogram`, `summary`).
    pub types: BTreeMap<String, String>,
}

impl Exposition {
    /// Parses `text`; a line that is not a comment, blank or a sample fails the test.
    pub fn parse(text: &str) -> Self {
        let mut exposition = Exposition::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    exposition.types.insert(name.to_owned(), kind.to_owned());
                }
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            exposition
                .samples
                .push(parse_sample(line).unwrap_or_else(|| panic!("not a sample line: {line:?}")));
        }
        exposition
    }

    /// The names of every sample (`…_bucket`, `…_count` for histograms).
    pub fn sample_names(&self) -> BTreeSet<String> {
        self.samples.iter().map(|s| s.name.clone()).collect()
    }

    /// The first sample named `name` whose labels include all of `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
    }

    /// Whether any sample is named `name`, whatever its labels.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => break i,
                ',' | ' ' => {}
                '=' => {
                    // A quoted value, with \" \\ and \n escapes.
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                other => key.push(other),
            }
        };
        rest = &inner[end + 1..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

#[test]
fn samples_are_read_with_their_labels() {
    let text = "# TYPE h histogram\nh_bucket{route=\"/a\",le=\"0.5\"} 3\nh_bucket{route=\"/a\",le=\"+Inf\"} 4\nc 7\ng{q=\"x\\\"y\"} 1.5\n";
    let e = Exposition::parse(text);
    assert_eq!(e.types.get("h").map(String::as_str), Some("histogram"));
    assert_eq!(e.value("h_bucket", &[("le", "0.5")]), Some(3.0));
    assert_eq!(
        e.value("h_bucket", &[("route", "/a"), ("le", "+Inf")]),
        Some(4.0)
    );
    assert_eq!(e.value("c", &[]), Some(7.0));
    assert_eq!(e.value("g", &[("q", "x\"y")]), Some(1.5));
    assert_eq!(e.value("h_bucket", &[("le", "1")]), None);
}
