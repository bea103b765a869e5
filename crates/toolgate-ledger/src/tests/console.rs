//! Console sessions and client approval links, on both backends: a session is found by its
//! hash, touched only while valid, ended and purged; a link is used once, only unexpired, and
//! its audit events join the tenant's chain with it (none for a refused use).

use serde_json::json;
use toolgate_core::Timestamp;

use super::*;
use crate::console::{ClientLink, ConsoleSession};

fn session(id: &str, at: i64, max_ms: i64) -> ConsoleSession {
    ConsoleSession {
        id_hash: format!("{id:0>64}"),
        token_hash: format!("{:0>64}", "token"),
        csrf: format!("csrf-of-{id}"),
        created_at: Timestamp(at),
        last_seen_at: Timestamp(at),
        expires_at: Timestamp(at + max_ms),
    }
}

on_both_backends! {
    async fn console_sessions(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let t0 = T0.0;
        let open = session("s1", t0, 10_000);
        store.create_console_session(open.clone()).await.unwrap();
        assert_exists(store.create_console_session(open.clone()).await, "console session");
        assert_eq!(store.get_console_session(&open.id_hash).await.unwrap(), Some(open.clone()));
        assert_eq!(store.get_console_session(&format!("{:0>64}", "x")).await.unwrap(), None);

        // Touched while valid (idle 1 s): moves last_seen_at; not after 1 s idle.
        assert!(store.touch_console_session(&open.id_hash, Timestamp(t0 + 900), 1_000).await.unwrap());
        let seen = store.get_console_session(&open.id_hash).await.unwrap().unwrap();
        assert_eq!(seen.last_seen_at, Timestamp(t0 + 900));
        assert!(!store.touch_console_session(&open.id_hash, Timestamp(t0 + 1_900), 1_000).await.unwrap());
        // Never past the absolute expiry, however active.
        let busy = session("s2", t0, 2_000);
        store.create_console_session(busy.clone()).await.unwrap();
        assert!(store.touch_console_session(&busy.id_hash, Timestamp(t0 + 900), 1_000).await.unwrap());
        assert!(store.touch_console_session(&busy.id_hash, Timestamp(t0 + 1_800), 1_000).await.unwrap());
        assert!(!store.touch_console_session(&busy.id_hash, Timestamp(t0 + 2_000), 1_000).await.unwrap());

        // Sign-out removes it once.
        assert!(store.delete_console_session(&open.id_hash).await.unwrap());
        assert!(!store.delete_console_session(&open.id_hash).await.unwrap());
        // The purge takes the expired and the idle ones, and leaves a fresh one.
        let fresh = session("s3", t0 + 5_000, 10_000);
        store.create_console_session(fresh.clone()).await.unwrap();
        let purged = store
            .purge_console_sessions(Timestamp(t0 + 5_000), Timestamp(t0 + 4_000))
            .await
            .unwrap();
        assert_eq!(purged, 1, "s2 is past its expiry");
        assert!(store.get_console_session(&busy.id_hash).await.unwrap().is_none());
        assert!(store.get_console_session(&fresh.id_hash).await.unwrap().is_some());
    }
}

on_both_backends! {
    async fn client_links_are_used_once(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let acme = tenant_id("acme");
        let link = ClientLink {
            hash: format!("{:0>64}", "link"),
            id: "cl_1".to_owned(),
            tenant: acme.clone(),
            invocation_id: "pend-c-link".to_owned(),
            created_at: T0,
            expires_at: Timestamp(T0.0 + 1_000),
            used_at: None,
            used_decision: None,
        };
        let event = |kind: &str| NewAuditEvent {
            tenant: acme.clone(),
            kind: kind.to_owned(),
            run: None,
            tool_call_id: None,
            payload: json!({ "link_id": "cl_1" }),
            at: T0,
        };
        // The link's invocation: a call waiting for a decision.
        store
            .record_call(waiting_call("acme", "c-link", None))
            .await
            .unwrap();
        let before = events_of(store, "acme").await.len();
        store
            .create_client_link(link.clone(), vec![event("console.client_link_issued")])
            .await
            .unwrap();
        assert_eq!(store.get_client_link(&link.hash).await.unwrap(), Some(link.clone()));
        assert_eq!(store.get_client_link(&format!("{:0>64}", "nope")).await.unwrap(), None);

        // Expired: refused, nothing written.
        assert!(!store
            .use_client_link(&link.hash, Timestamp(T0.0 + 1_000), "approve", vec![event("console.client_link_used")])
            .await
            .unwrap());
        assert_eq!(events_of(store, "acme").await.len(), before + 1);
        // In time: used once, with its event; a second use is refused.
        assert!(store
            .use_client_link(&link.hash, Timestamp(T0.0 + 500), "approve", vec![event("console.client_link_used")])
            .await
            .unwrap());
        assert!(!store
            .use_client_link(&link.hash, Timestamp(T0.0 + 600), "reject", vec![event("console.client_link_used")])
            .await
            .unwrap());
        let used = store.get_client_link(&link.hash).await.unwrap().unwrap();
        assert_eq!(used.used_at, Some(Timestamp(T0.0 + 500)));
        assert_eq!(used.used_decision.as_deref(), Some("approve"));
        // A use that decided nothing is released once, by the use it undoes only.
        assert!(!store
            .release_client_link(&link.hash, Timestamp(T0.0 + 499), vec![event("console.client_link_released")])
            .await
            .unwrap());
        assert!(store
            .release_client_link(&link.hash, Timestamp(T0.0 + 500), vec![event("console.client_link_released")])
            .await
            .unwrap());
        assert!(!store
            .release_client_link(&link.hash, Timestamp(T0.0 + 500), vec![event("console.client_link_released")])
            .await
            .unwrap());
        let released = store.get_client_link(&link.hash).await.unwrap().unwrap();
        assert_eq!((released.used_at, released.used_decision), (None, None));
        assert!(store
            .use_client_link(&link.hash, Timestamp(T0.0 + 700), "reject", vec![event("console.client_link_used")])
            .await
            .unwrap());
        let kinds: Vec<String> = events_of(store, "acme").await.into_iter().map(|e| e.kind).skip(before).collect();
        assert_eq!(
            kinds,
            [
                "console.client_link_issued",
                "console.client_link_used",
                "console.client_link_released",
                "console.client_link_used"
            ]
        );
        // Once the invocation is decided, the use that decided it is never given back.
        assert!(store
            .resolve_pending(decide("c-link", 1, false, "alice"))
            .await
            .unwrap());
        assert!(!store
            .release_client_link(&link.hash, Timestamp(T0.0 + 700), vec![event("console.client_link_released")])
            .await
            .unwrap());
        let spent = store.get_client_link(&link.hash).await.unwrap().unwrap();
        assert_eq!(spent.used_at, Some(Timestamp(T0.0 + 700)));
        assert_eq!(store.verify_chains().await.unwrap().first_problem, None, "the chain stays whole");
    }
}
