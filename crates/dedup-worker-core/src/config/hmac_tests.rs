//! `[sources.NAME.hmac]`: templates, presets overridden, and each refusal naming its key.

use figment::providers::{Format, Serialized, Toml};

use super::*;
use crate::config::hmac_presets::presets;
use crate::config::{defaults, Settings};

fn load(extra: &str) -> Result<Settings, ConfigError> {
    Settings::from_figment(
        defaults()
            .merge(Serialized::default("stripe.secrets", "whsec_test"))
            .merge(Toml::string(extra)),
    )
}

/// A preset's field overridden by the source's own; the preset's tolerance, then the
/// source's.
#[test]
fn the_sources_fields_override_its_presets() {
    let s = load(
        "[sources.forms]\nscheme = \"hmac\"\npreset = \"typeform\"\nsecrets = \"k\"\n\
         [sources.forms.hmac]\nid_pointer = \"/form_response/token\"\n\
         [sources.hs]\nscheme = \"hmac\"\npreset = \"hubspot\"\nsecrets = \"k\"\n\
         public_url = \"https://h.example/webhooks/hs\"\n\
         [sources.cal]\nscheme = \"hmac\"\npreset = \"calendly\"\nsecrets = \"k\"\n\
         tolerance = \"1m\"\n",
    )
    .expect("valid");
    let forms = &s.sources["forms"];
    let rules = resolve("forms", forms.preset.as_deref(), forms.hmac.as_ref()).expect("rules");
    assert_eq!(
        rules.id,
        Locator::Pointer(vec!["/form_response/token".into()])
    );
    assert_eq!(rules.signature_prefix, "sha256=");
    assert_eq!(rules.encoding, Encoding::Base64);
    assert_eq!(s.sources["hs"].tolerance_secs(), 300);
    assert_eq!(s.sources["cal"].tolerance_secs(), 60);
}

#[test]
fn each_refusal_names_the_key() {
    let src = "[sources.x]\nscheme = \"hmac\"\nsecrets = \"k\"\n";
    for (extra, key, why) in [
        ("[sources.x.hmac]\nid_header = \"X-Id\"\n", "sources.x.hmac.signature_header", "required"),
        ("preset = \"nope\"\n", "sources.x.preset", "unknown preset"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\n", "sources.x.hmac.id_header", "id_pointer"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_header = \"I\"\nsigned = \"{timestamp}.{body}\"\n", "sources.x.hmac.signed", "timestamp_header"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_header = \"I\"\nsigned = \"{url}\"\n", "sources.x.hmac.signed", "{body}"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_header = \"I\"\nsigned = \"{url}{body}\"\n", "sources.x.public_url", "signs the URL"),
        ("tolerance = \"1m\"\n[sources.x.hmac]\nsignature_header = \"S\"\nid_header = \"I\"\n", "sources.x.tolerance", "signs no timestamp"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_pointer = \"event_id\"\n", "sources.x.hmac.id_pointer", "JSON pointer"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_header = \"I\"\nid_pointer = \"/id\"\n", "sources.x.hmac.id_pointer", "not both"),
        ("[sources.x.hmac]\nsignature_header = \"bad header\"\nid_header = \"I\"\n", "sources.x.hmac.signature_header", "header name"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_header = \"I\"\nsignature_key = \"v1\"\n", "sources.x.hmac.signature_key", "separator"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_header = \"I\"\nsecret_encoding = \"hex\"\n", "sources.x.secrets", "not hex"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_header = \"I\"\nalgorithm = \"md5\"\n", "sources.x.hmac.algorithm", "unknown variant"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_header = \"I\"\nheader = \"S\"\n", "sources.x.hmac", "unknown field"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_header = \"I\"\nitems_pointer = \"\"\n", "sources.x.hmac.items_pointer", "id_pointer"),
        ("[sources.x.hmac]\nsignature_header = \"S\"\nid_pointer = \"/id\"\nitems_pointer = \"events\"\n", "sources.x.hmac.items_pointer", "JSON pointer"),
    ] {
        let toml = format!("{src}{extra}");
        let text = load(&toml).expect_err(&toml).to_string();
        assert!(text.contains(key) && text.contains(why), "{toml}: {text}");
    }
    let text = load("[sources.gh]\nscheme = \"github\"\nsecrets = \"k\"\npreset = \"typeform\"\n")
        .expect_err("a preset on a named scheme")
        .to_string();
    assert!(text.contains("sources.gh.preset"), "{text}");
}

#[test]
fn templates_parse_into_pieces_and_must_sign_the_body_once() {
    assert_eq!(
        parse_template("v0:{timestamp}:{body}").unwrap(),
        [
            Piece::Text("v0:".into()),
            Piece::Timestamp,
            Piece::Text(":".into()),
            Piece::Body
        ]
    );
    assert_eq!(
        parse_template("{method}{url}{body}{header:X-Id}").unwrap(),
        [
            Piece::Method,
            Piece::Url,
            Piece::Body,
            Piece::Header("x-id".into())
        ]
    );
    for bad in [
        "{timestamp}",
        "{body}{body}",
        "{body",
        "{body}}",
        "{bogus}{body}",
        "{header:bad name}{body}",
    ] {
        assert!(parse_template(bad).is_err(), "{bad}");
    }
}

/// Every shipped preset parses and resolves alone (a source giving only `preset`), and
/// cites a web page.
#[test]
fn every_preset_resolves_and_cites_its_documentation() {
    let all = presets().expect("the shipped presets parse");
    assert!(all.len() >= 10, "{}", all.len());
    for (name, preset) in all {
        assert!(preset.doc.starts_with("https://"), "{name}: {}", preset.doc);
        let rules = resolve(name, Some(name), None).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            rules.timestamp.is_some(),
            preset.tolerance_secs.is_some(),
            "{name}: a tolerance exactly where a timestamp is signed"
        );
    }
}
