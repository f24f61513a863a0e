//! `v1a` (ed25519): RFC 8032's vectors through [`verify_v1a`], what the signature covers (id,
//! timestamp, body), malformed items beside valid ones, and the bounds on the work.

use super::*;
use crate::signature::ed25519::StandardSigningKey;
use ed25519_dalek::Verifier as _;

/// RFC 8032 section 7.1, TEST 1 to 3: secret key (seed), public key, message, signature (hex).
const RFC8032: [(&str, &str, &str, &str); 3] = [
    (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
    (
        "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
        "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
        "af82",
        "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
    ),
];

const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const T: i64 = 1_614_265_330;
const PAYLOAD: &[u8] = br#"{"test": 2432232314}"#;

fn bytes<const N: usize>(hex_text: &str) -> [u8; N] {
    hex::decode(hex_text)
        .expect("hex")
        .try_into()
        .expect("length")
}

/// TEST `n`'s signing key and its public key.
fn rfc_key(n: usize) -> (StandardSigningKey, StandardPublicKey) {
    let signing = StandardSigningKey::from_seed(&bytes(RFC8032[n].0));
    let public = StandardPublicKey::from_bytes(&bytes(RFC8032[n].1)).expect("the RFC's key");
    (signing, public)
}

fn headers<'a>(id: &'a str, t: &'a str, signature: &'a str) -> StandardHeaders<'a> {
    StandardHeaders {
        id: Some(id),
        timestamp: Some(t),
        signature: Some(signature),
    }
}

/// `item` (`v1a,<base64>`) with one bit of its signature flipped.
fn flip_signature_bit(item: &str, bit: usize) -> String {
    let mut sig = BASE64
        .decode(item.strip_prefix("v1a,").expect("a v1a item"))
        .expect("base64");
    sig[bit / 8] ^= 1 << (bit % 8);
    format!("v1a,{}", BASE64.encode(sig))
}

#[test]
fn rfc8032_vectors_verify_and_any_one_bit_change_fails() {
    for (n, (seed, public, message, signature)) in RFC8032.iter().enumerate() {
        let (signing, key) = rfc_key(n);
        let (message, signature) = (hex::decode(message).expect("hex"), bytes::<64>(signature));
        // Our signer derives the RFC's public key and makes the RFC's (deterministic) signature.
        assert_eq!(
            signing.public_key(),
            key,
            "TEST {}: public key of {seed}",
            n + 1
        );
        assert_eq!(signing.sign_content(&message), signature, "TEST {}", n + 1);
        assert_eq!(key.verifying_key().as_bytes(), &bytes::<32>(public));

        assert!(
            verify_v1a(key.verifying_key(), &message, &signature),
            "TEST {}",
            n + 1
        );
        for bit in 0..512 {
            let mut flipped = signature;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !verify_v1a(key.verifying_key(), &message, &flipped),
                "TEST {}: signature bit {bit} flipped still verifies",
                n + 1
            );
        }
        for bit in 0..message.len() * 8 {
            let mut flipped = message.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(!verify_v1a(key.verifying_key(), &flipped, &signature));
        }
        // TEST 1's message is empty: no bit to flip, so one added.
        assert!(!verify_v1a(
            key.verifying_key(),
            &[&message[..], &b"\0"[..]].concat(),
            &signature
        ));
        // Another vector's key does not verify it.
        let (_, other) = rfc_key((n + 1) % RFC8032.len());
        assert!(!verify_v1a(other.verifying_key(), &message, &signature));
    }
}

#[test]
fn v1a_covers_the_id_the_timestamp_and_the_body() {
    let (signing, key) = rfc_key(0);
    let keys = [key];
    let verify = |id: &str, t: i64, signature: &str, payload: &[u8]| {
        let t = t.to_string();
        verify_standard_signature(
            headers(id, &t, signature),
            payload,
            StandardKeys::ed25519(&keys),
            300,
            T,
        )
    };
    let item = signing.sign(ID, T, PAYLOAD);
    assert_eq!(verify(ID, T, &item, PAYLOAD), Ok(()));
    // The signed content is exactly `{id}.{timestamp}.{payload}`, the v1 content.
    let sig: [u8; 64] = BASE64
        .decode(&item["v1a,".len()..])
        .expect("base64")
        .try_into()
        .expect("64 bytes");
    let content = [format!("{ID}.{T}.").as_bytes(), PAYLOAD].concat();
    assert!(verify_v1a(key.verifying_key(), &content, &sig));

    let mismatch = Err(StandardSignatureError::NoMatchingSignature { malformed: 0 });
    let mut id = ID.as_bytes().to_vec();
    id[0] ^= 1; // "msg_…" → "lsg_…"
    let id = String::from_utf8(id).expect("ASCII");
    assert_eq!(verify(&id, T, &item, PAYLOAD), mismatch, "id bit");
    assert_eq!(verify(ID, T ^ 1, &item, PAYLOAD), mismatch, "timestamp bit");
    let mut payload = PAYLOAD.to_vec();
    payload[3] ^= 0x20;
    assert_eq!(verify(ID, T, &item, &payload), mismatch, "body bit");
    for bit in [0, 255, 256, 511] {
        let flipped = flip_signature_bit(&item, bit);
        assert_eq!(
            verify(ID, T, &flipped, PAYLOAD),
            mismatch,
            "signature bit {bit}"
        );
    }
}

#[test]
fn any_one_valid_item_verifies_and_malformed_ones_are_counted() {
    let (signing, key) = rfc_key(1);
    let hmac_key = decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
    let secrets = [hmac_key.clone()];
    let public_keys = [key];
    let both = StandardKeys {
        secrets: &secrets,
        public_keys: &public_keys,
    };
    let t = T.to_string();
    let v1a = signing.sign(ID, T, PAYLOAD);
    let v1 = standard_signature(&hmac_key, ID, T, PAYLOAD);
    let verify = |signature: &str, keys: StandardKeys<'_>| {
        verify_standard_signature(headers(ID, &t, signature), PAYLOAD, keys, 300, T)
    };
    // Garbage v1 items (not base64, wrong length) and malformed v1a ones beside a valid v1a.
    let garbage = "v1,garbage!! v1,AAAA v1a,%%% v1a,AAAA";
    assert_eq!(verify(&format!("{garbage} {v1a}"), both), Ok(()));
    assert_eq!(
        verify(
            &format!("{v1a} {garbage}"),
            StandardKeys::ed25519(&public_keys)
        ),
        Ok(())
    );
    assert_eq!(verify(&format!("{garbage} {v1}"), both), Ok(()));
    // Each kind of key verifies its own scheme only.
    assert_eq!(verify(&v1, StandardKeys::hmac(&secrets)), Ok(()));
    let mismatch = |malformed| Err(StandardSignatureError::NoMatchingSignature { malformed });
    assert_eq!(verify(&v1a, StandardKeys::hmac(&secrets)), mismatch(0));
    assert_eq!(
        verify(&v1, StandardKeys::ed25519(&public_keys)),
        mismatch(0)
    );
    // A v1a item of another key pair.
    let (stranger, _) = rfc_key(2);
    assert_eq!(verify(&stranger.sign(ID, T, PAYLOAD), both), mismatch(0));
    // Nothing valid: refused, saying how many items could not even be read.
    let refused = verify(garbage, both).expect_err("nothing valid");
    assert_eq!(
        refused,
        StandardSignatureError::NoMatchingSignature { malformed: 4 }
    );
    assert_eq!(refused.check(), "signature_mismatch");
    assert!(
        refused
            .to_string()
            .contains("4 of the signatures is not base64"),
        "{refused}"
    );
    // `v1a` without its comma, or another version, is no candidate at all.
    let none = verify("v1a v1b,AAAA v2,AAAA", both).expect_err("no candidate");
    assert_eq!(none, StandardSignatureError::NoV1Signature);
    assert_eq!(none.check(), "no_v1_signature");
    assert!(none.to_string().contains("v1 or v1a"), "{none}");
}

#[test]
fn v1a_items_count_in_the_bound_and_the_ed25519_work_is_bounded() {
    let (signing, key) = rfc_key(0);
    let (_, other) = rfc_key(1);
    let t = T.to_string();
    let valid = signing.sign(ID, T, PAYLOAD);
    let filler = flip_signature_bit(&valid, 7);
    let list = |n: usize| format!("{}{valid}", format!("{filler} ").repeat(n - 1));
    let verify = |signature: &str, public_keys: &[StandardPublicKey], now: i64| {
        verify_standard_signature(
            headers(ID, &t, signature),
            PAYLOAD,
            StandardKeys::ed25519(public_keys),
            300,
            now,
        )
    };
    // One key: 16 v1a items are 16 verifications, the most allowed.
    assert_eq!(verify(&list(MAX_SIGNATURES), &[key], T), Ok(()));
    // 17 items, v1 and v1a counted together: refused with the valid one among them, and before
    // the timestamp is even looked at (so before any verification).
    let seventeen = format!("v1,AAAA {}", list(MAX_SIGNATURES));
    for now in [T, T + 10_000] {
        assert_eq!(
            verify(&seventeen, &[key], now),
            Err(StandardSignatureError::TooManySignatures)
        );
    }
    // Two keys: 8 v1a items are 16 verifications; 9 are 18, refused the same way.
    let keys = [other, key];
    assert_eq!(verify(&list(8), &keys, T), Ok(()));
    let too_many = verify(&list(9), &keys, T + 10_000).expect_err("18 verifications");
    assert_eq!(
        too_many,
        StandardSignatureError::TooManyEd25519Checks {
            signatures: 9,
            public_keys: 2
        }
    );
    assert_eq!(too_many.check(), "malformed_header");
    assert!(
        too_many.to_string().contains("16 ed25519 verifications"),
        "{too_many}"
    );
    // v1 items cost no ed25519 work: 8 v1a and 8 v1 items under two keys are within bounds.
    let mixed = format!("{} {}", "v1,AAAA ".repeat(8).trim_end(), list(8));
    assert_eq!(verify(&mixed, &keys, T), Ok(()));
    // No public key: v1a items cost nothing and cannot match.
    assert_eq!(
        verify(&list(MAX_SIGNATURES), &[], T),
        Err(StandardSignatureError::NoMatchingSignature { malformed: 0 })
    );
}

#[test]
fn verify_strict_refuses_the_small_order_forgery() {
    // The neutral point as public key, and R = the neutral point with S = 0: the RFC's
    // cofactorless check [S]B = R + [k]A holds for every message. A key the configuration would
    // refuse (`StandardPublicKey::from_bytes`), but the core check must refuse it on its own.
    let mut neutral = [0u8; 32];
    neutral[0] = 1;
    let weak = VerifyingKey::from_bytes(&neutral).expect("a point");
    let mut forged = [0u8; 64];
    forged[..32].copy_from_slice(&neutral);
    let message = b"msg_1.1614265330.{}";
    assert!(
        weak.verify(message, &Signature::from_bytes(&forged))
            .is_ok(),
        "the lax check accepts it (else this test shows nothing)"
    );
    assert!(!verify_v1a(&weak, message, &forged));
    assert!(StandardPublicKey::from_bytes(&neutral).is_err());
}

use crate::proptest_support::config;
use proptest::prelude::*;
use proptest::sample::Index;

proptest! {
    // Few cases: ed25519 in an unoptimised test build takes milliseconds per operation.
    #![proptest_config(config(24))]

    /// Rotation across schemes: among v1 and v1a items of other keys, garbage and other
    /// schemes, one v1a by any configured public key verifies; without it, nothing does.
    #[test]
    fn v1a_rotation_any_listed_signature_by_any_key(
        // At most 2 keys and 7 v1a items: within the bound on ed25519 work.
        seeds in prop::collection::vec(any::<[u8; 32]>(), 1..3),
        signer in any::<Index>(),
        others in prop::collection::vec(any::<[u8; 32]>(), 0..3),
        garbage in prop::collection::vec("v1a?,[A-Za-z0-9+/=]{0,90}|v2,[!-~]{0,10}", 0..5),
        at in any::<Index>(),
        payload in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        prop_assume!(!others.iter().any(|o| seeds.contains(o)));
        let t = T.to_string();
        let signing: Vec<StandardSigningKey> = seeds.iter().map(StandardSigningKey::from_seed).collect();
        let keys: Vec<StandardPublicKey> = signing.iter().map(StandardSigningKey::public_key).collect();
        let mut items: Vec<String> = others
            .iter()
            .map(|seed| StandardSigningKey::from_seed(seed).sign(ID, T, &payload))
            .chain(others.iter().map(|seed| standard_signature(seed, ID, T, &payload)))
            .chain(garbage)
            .collect();
        let others_only = items.join(" ");
        let own = signing[signer.index(signing.len())].sign(ID, T, &payload);
        items.insert(at.index(items.len() + 1), own);
        let all = items.join(" ");
        let verify = |signature: &str| verify_standard_signature(
            headers(ID, &t, signature), &payload, StandardKeys::ed25519(&keys), 300, T);
        prop_assert_eq!(verify(&all), Ok(()));
        prop_assert!(matches!(
            verify(&others_only),
            Err(StandardSignatureError::NoMatchingSignature { .. } | StandardSignatureError::NoV1Signature)
        ), "refused as not matching");
    }
}
