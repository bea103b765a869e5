//! The `Store` contract, each test run on SQLite and on PostgreSQL (`<test>::sqlite`,
//! `<test>::pg`), each on fresh data (a temporary file, a schema of its own).

use std::sync::Arc;

use serde_json::json;
use toolgate_core::{ErrorCode, Timestamp, ToolCallStatus, ToolUseId};

use super::*;
use crate::error::LedgerError;
use crate::model::*;

// --- tenants, agents, tokens, configuration -------------------------------------------------

on_both_backends! {
    async fn tenants_and_agents(backend: Backend) {
        let db = Db::new(backend).await;
        let store = db.store();
        store.create_tenant(tenant("beta"), &admin()).await.unwrap();
        store.create_tenant(tenant("acme"), &admin()).await.unwrap();
        assert_exists(store.create_tenant(tenant("acme"), &admin()).await, "tenant acme");
        assert_eq!(
            store.get_tenant(&tenant_id("acme")).await.unwrap(),
            Some(tenant("acme"))
        );
        assert_eq!(store.get_tenant(&tenant_id("nope")).await.unwrap(), None);
        let ids: Vec<String> = store
            .list_tenants()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id.to_string())
            .collect();
        assert_eq!(ids, ["acme", "beta"]);

        store.create_agent(agent("acme", "bot"), &admin()).await.unwrap();
        store.create_agent(agent("acme", "analyst"), &admin()).await.unwrap();
        store.create_agent(agent("beta", "bot"), &admin()).await.unwrap();
        assert_exists(
            store.create_agent(agent("acme", "bot"), &admin()).await,
            "agent acme/bot",
        );
        assert_not_found(
            store.create_agent(agent("nope", "bot"), &admin()).await,
            "tenant nope",
        );
        assert_eq!(
            store
                .get_agent(&tenant_id("acme"), &agent_id("bot"))
                .await
                .unwrap(),
            Some(agent("acme", "bot"))
        );
        assert_eq!(
            store
                .get_agent(&tenant_id("acme"), &agent_id("ghost"))
                .await
                .unwrap(),
            None
        );
        let acme_agents: Vec<String> = store
            .list_agents(&tenant_id("acme"))
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.id.to_string())
            .collect();
        assert_eq!(acme_agents, ["analyst", "bot"]);
    }
}

on_both_backends! {
    async fn tokens(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let token = |id: &str, role: Role, tenant: Option<&str>, agent: Option<&str>| TokenRecord {
            id: id.to_owned(),
            hash: format!("{:0>64}", id),
            role,
            tenant: tenant.map(tenant_id),
            agent: agent.map(agent_id),
            label: format!("label of {id}"),
            created_at: T0,
            revoked: false,
        };
        let admin_token = token("tok-admin", Role::Admin, None, None);
        let runtime = token("tok-agent", Role::Agent, Some("acme"), Some("bot"));
        let approver = token("tok-approver", Role::Approver, Some("acme"), None);
        for record in [&admin_token, &runtime, &approver] {
            store.create_token(record.clone(), &admin()).await.unwrap();
        }

        let cases: Vec<(TokenRecord, &str)> = vec![
            (token("t1", Role::Agent, Some("nope"), None), "tenant nope"),
            (
                token("t2", Role::Agent, Some("acme"), Some("ghost")),
                "agent acme/ghost",
            ),
        ];
        for (record, missing) in cases {
            assert_not_found(store.create_token(record, &admin()).await, missing);
        }
        // A taken id, and a taken hash: the error never repeats the hash.
        assert_exists(store.create_token(admin_token.clone(), &admin()).await, "token tok-admin");
        let same_secret = TokenRecord {
            id: "tok-other".into(),
            ..runtime.clone()
        };
        let error = store.create_token(same_secret, &admin()).await.unwrap_err();
        assert!(matches!(error, LedgerError::AlreadyExists(_)), "{error:?}");
        assert!(!error.to_string().contains(&runtime.hash), "{error}");

        assert_eq!(
            store.find_token(&runtime.hash).await.unwrap(),
            Some(runtime.clone())
        );
        assert_eq!(store.find_token(&"f".repeat(64)).await.unwrap(), None);
        let admins = store.list_tokens(None).await.unwrap();
        assert_eq!(admins, vec![admin_token.clone()]);
        let acme: Vec<String> = store
            .list_tokens(Some(&tenant_id("acme")))
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect();
        assert_eq!(acme, ["tok-agent", "tok-approver"]);

        store.revoke_token("tok-agent", &admin()).await.unwrap();
        let revoked = store.find_token(&runtime.hash).await.unwrap().unwrap();
        assert!(revoked.revoked);
        assert_not_found(store.revoke_token("tok-ghost", &admin()).await, "token tok-ghost");
    }
}

on_both_backends! {
    async fn permissions_flags_and_policy_sets(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let acme = tenant_id("acme");
        let grant = |agent: Option<&str>, name: &str, enabled: bool, at: i64| Permission {
            tenant: acme.clone(),
            agent: agent.map(agent_id),
            tool: tool(name),
            enabled,
            updated_at: Timestamp(at),
        };
        store
            .put_permission(grant(None, "slack.post_message", true, 1), &admin())
            .await
            .unwrap();
        // An upsert of the tenant-wide grant, not a second row.
        store
            .put_permission(grant(None, "slack.post_message", false, 2), &admin())
            .await
            .unwrap();
        store
            .put_permission(grant(Some("bot"), "slack.post_message", true, 3), &admin())
            .await
            .unwrap();
        store
            .put_permission(grant(Some("bot"), "aws.ec2_inventory", true, 4), &admin())
            .await
            .unwrap();
        store
            .put_permission(grant(Some("bot"), "aws.ec2_inventory", true, 5), &admin())
            .await
            .unwrap();
        assert_not_found(
            store
                .put_permission(grant(Some("ghost"), "aws.ec2_inventory", true, 6), &admin())
                .await,
            "agent acme/ghost",
        );
        let mut elsewhere = grant(None, "aws.ec2_inventory", true, 7);
        elsewhere.tenant = tenant_id("nope");
        assert_not_found(store.put_permission(elsewhere, &admin()).await, "tenant nope");

        assert_eq!(
            store.list_permissions(&acme, None).await.unwrap(),
            vec![grant(None, "slack.post_message", false, 2)]
        );
        assert_eq!(
            store
                .list_permissions(&acme, Some(&agent_id("bot")))
                .await
                .unwrap(),
            vec![
                grant(Some("bot"), "aws.ec2_inventory", true, 5),
                grant(None, "slack.post_message", false, 2),
                grant(Some("bot"), "slack.post_message", true, 3),
            ]
        );
        assert_eq!(
            store.granted_tools(&acme).await.unwrap(),
            vec![tool("aws.ec2_inventory"), tool("slack.post_message")]
        );

        assert_eq!(
            store.get_flag(&acme, TOOL_CALLING_ENABLED).await.unwrap(),
            None
        );
        for enabled in [true, false] {
            store
                .set_flag(&acme, TOOL_CALLING_ENABLED, enabled, &admin())
                .await
                .unwrap();
            assert_eq!(
                store.get_flag(&acme, TOOL_CALLING_ENABLED).await.unwrap(),
                Some(enabled)
            );
        }
        assert_not_found(
            store
                .set_flag(&tenant_id("nope"), TOOL_CALLING_ENABLED, true, &admin())
                .await,
            "tenant nope",
        );

        assert_eq!(store.current_policy_set(&acme).await.unwrap(), None);
        for (expected, text) in [
            (1, "permit(principal, action, resource);"),
            (2, "forbid(principal, action, resource);"),
        ] {
            let version = store
                .put_policy_set(&acme, text, &Actor::token("tok-admin", T0.plus_ms(expected)))
                .await
                .unwrap();
            assert_eq!(version, expected);
        }
        let current = store.current_policy_set(&acme).await.unwrap().unwrap();
        assert_eq!(
            (
                current.version,
                current.text.as_str(),
                current.created_by.as_str()
            ),
            (2, "forbid(principal, action, resource);", "tok-admin")
        );
        let missing = store
            .put_policy_set(&tenant_id("nope"), "x", &admin())
            .await
            .map(|_| ());
        assert_not_found(missing, "tenant nope");
    }
}

on_both_backends! {
    async fn runs(backend: Backend) {
        let db = seeded(backend, 3).await;
        let store = db.store();
        store.create_tenant(tenant("beta"), &admin()).await.unwrap();
        assert_eq!(
            store
                .get_run(&tenant_id("acme"), &run_id("run-1"))
                .await
                .unwrap(),
            Some(run("acme", "run-1", 3))
        );
        // Another tenant's run is invisible.
        assert_eq!(
            store
                .get_run(&tenant_id("beta"), &run_id("run-1"))
                .await
                .unwrap(),
            None
        );
        assert_exists(store.create_run(run("acme", "run-1", 3)).await, "run run-1");
        let mut orphan = run("acme", "run-2", 3);
        orphan.agent = agent_id("ghost");
        assert_not_found(store.create_run(orphan).await, "agent acme/ghost");
        assert_not_found(
            store.create_run(run("nope", "run-3", 3)).await,
            "tenant nope",
        );
    }
}

// --- calls -----------------------------------------------------------------------------------

on_both_backends! {
    async fn record_call_outcomes_and_budget(backend: Backend) {
        let db = seeded(backend, 2).await;
        let store = db.store();
        let acme = tenant_id("acme");

        for id in ["call-1", "call-2"] {
            let outcome = store
                .record_call(new_call("acme", "run-1", id, Some(&format!("use-{id}"))))
                .await
                .unwrap();
            assert_eq!(outcome, RecordOutcome::Recorded);
        }
        let first = store
            .get_tool_call(&acme, &call_id("call-1"))
            .await
            .unwrap();
        assert_eq!(
            first,
            Some(new_call("acme", "run-1", "call-1", Some("use-call-1")).call)
        );

        // The same tool_use_id again: the recorded call comes back and nothing is written.
        let events_before = events_of(store, "acme").await.len();
        let retry = new_call("acme", "run-1", "call-1-retry", Some("use-call-1"));
        let outcome = store.record_call(retry).await.unwrap();
        assert_eq!(outcome, RecordOutcome::Duplicate(first.clone().unwrap()));
        assert_eq!(events_of(store, "acme").await.len(), events_before);
        assert_eq!(
            store
                .get_tool_call(&acme, &call_id("call-1-retry"))
                .await
                .unwrap(),
            None
        );

        // The third counted call is over the budget of 2: blocked, with its requested event and
        // a blocked event; the decision, the pending invocation and other events are dropped.
        let mut third = new_call("acme", "run-1", "call-3", Some("use-call-3"));
        third.events.push(event(
            "acme",
            "tool_call.approval_requested",
            "run-1",
            "call-3",
        ));
        third.pending = Some(pending("acme", "call-3"));
        let outcome = store.record_call(third).await.unwrap();
        let RecordOutcome::BudgetExceeded(blocked) = outcome else {
            panic!("expected BudgetExceeded, got {outcome:?}");
        };
        assert_eq!(blocked.status, ToolCallStatus::Blocked);
        assert_eq!(blocked.error_code, Some(ErrorCode::BudgetExceeded));
        assert_eq!(
            blocked.error_text.as_deref(),
            Some("the run has used its budget of 2 tool calls")
        );
        assert_eq!(blocked.policy_decision_id, None);
        assert_eq!(
            store
                .get_tool_call(&acme, &call_id("call-3"))
                .await
                .unwrap(),
            Some(blocked)
        );
        assert_eq!(store.get_pending(&acme, "pend-call-3").await.unwrap(), None);
        let kinds: Vec<String> = events_of(store, "acme")
            .await
            .into_iter()
            .skip(events_before)
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, ["tool_call.requested", "tool_call.blocked"]);
        let blocked_event = events_of(store, "acme").await.pop().unwrap();
        assert_eq!(
            blocked_event.payload,
            json!({ "reason": "budget_exceeded" })
        );
        let run_now = store
            .get_run(&acme, &run_id("run-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((run_now.calls_used, run_now.pending_approvals), (2, 0));
        assert_eq!(run_now.status, RunStatus::Active);

        // A call that does not count still goes through.
        let mut free = new_call("acme", "run-1", "call-4", None);
        free.count_against_budget = false;
        assert_eq!(
            store.record_call(free).await.unwrap(),
            RecordOutcome::Recorded
        );

        // A taken call id (without a tool_use_id to match) and a missing run.
        let taken = store
            .record_call(new_call("acme", "run-1", "call-4", None))
            .await
            .map(|_| ());
        assert_exists(taken, "tool call call-4");
        let missing = store
            .record_call(new_call("acme", "run-404", "call-5", None))
            .await
            .map(|_| ());
        assert_not_found(missing, "run run-404");

        let page: Vec<String> = store
            .list_tool_calls(&acme, &run_id("run-1"), None, 2)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id.to_string())
            .collect();
        assert_eq!(page, ["call-1", "call-2"]);
        let next: Vec<String> = store
            .list_tool_calls(&acme, &run_id("run-1"), Some(&call_id("call-2")), 10)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id.to_string())
            .collect();
        assert_eq!(next, ["call-3", "call-4"]);
        // A cursor naming no call of the run is an empty page, never the first page again.
        assert!(
            store
                .list_tool_calls(&acme, &run_id("run-1"), Some(&call_id("call-404")), 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            store
                .find_tool_call_by_use_id(
                    &acme,
                    &run_id("run-1"),
                    &ToolUseId::new("use-call-2").unwrap()
                )
                .await
                .unwrap()
                .map(|c| c.id),
            Some(call_id("call-2"))
        );
        assert!(store.verify_chains().await.unwrap().first_problem.is_none());
    }
}

on_both_backends! {
    async fn pending_invocation_marks_the_run_waiting(backend: Backend) {
        let db = seeded(backend, 5).await;
        let store = db.store();
        let acme = tenant_id("acme");
        let call = waiting_call("acme", "call-1", Some("use-1"));
        assert_eq!(
            store.record_call(call).await.unwrap(),
            RecordOutcome::Recorded
        );

        let run_now = store
            .get_run(&acme, &run_id("run-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(run_now.status, RunStatus::WaitingApproval);
        assert_eq!((run_now.pending_approvals, run_now.calls_used), (1, 1));
        let recorded = store
            .get_tool_call(&acme, &call_id("call-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(recorded.status, ToolCallStatus::WaitingApproval);
        // After the setup's 2 events (tenant and agent created).
        let kinds: Vec<String> = events_of(store, "acme")
            .await
            .into_iter()
            .skip(2)
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            kinds,
            ["tool_call.requested", "tool_call.approval_requested"]
        );

        // A waiting call is not running: finishing it changes nothing.
        assert!(!store.finish_call(finish("acme", "call-1")).await.unwrap());
    }
}

on_both_backends! {
    async fn finish_call_only_from_running(backend: Backend) {
        let db = seeded(backend, 5).await;
        let store = db.store();
        let acme = tenant_id("acme");
        store
            .record_call(new_call("acme", "run-1", "call-1", None))
            .await
            .unwrap();

        // Another tenant cannot finish it.
        assert!(!store.finish_call(finish("beta", "call-1")).await.unwrap());
        assert!(store.finish_call(finish("acme", "call-1")).await.unwrap());
        let done = store
            .get_tool_call(&acme, &call_id("call-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(done.status, ToolCallStatus::Succeeded);
        assert_eq!(
            done.output_redacted,
            Some(json!({ "ok": true, "ts": "1.2" }))
        );
        assert_eq!((done.duration_ms, done.attempts), (Some(12), 1));
        assert_eq!(done.updated_at, T0.plus_ms(12));
        let events_after_first = events_of(store, "acme").await.len();
        // The setup's 2, requested and succeeded.
        assert_eq!(events_after_first, 4);

        let mut again = finish("acme", "call-1");
        again.status = ToolCallStatus::Failed;
        assert!(!store.finish_call(again).await.unwrap());
        assert_eq!(events_of(store, "acme").await.len(), events_after_first);
        let still = store
            .get_tool_call(&acme, &call_id("call-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(still.status, ToolCallStatus::Succeeded);
        assert!(!store.finish_call(finish("acme", "call-404")).await.unwrap());
    }
}

// --- group commit ------------------------------------------------------------------------------

on_both_backends! {
    async fn concurrent_writes_share_commits(backend: Backend) {
        let db = seeded(backend, 1_000).await;
        let store = db.shared();
        let before = db.stats();
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let id = format!("call-{i}");
                    store
                        .record_call(new_call("acme", "run-1", &id, Some(&format!("use-{i}"))))
                        .await
                })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.unwrap().unwrap(), RecordOutcome::Recorded);
        }
        let after = db.stats();
        let ops = after.ops - before.ops;
        let commits = after.commits - before.commits;
        assert_eq!(ops, 200);
        assert!(
            commits < ops,
            "200 writes took {commits} commits: nothing was batched"
        );
        assert_eq!(
            (after.bulk_fallbacks, after.step_by_step),
            (0, 0),
            "every call took the fast path"
        );

        let acme = tenant_id("acme");
        let run_now = store
            .get_run(&acme, &run_id("run-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(run_now.calls_used, 200);
        let report = store.verify_chains().await.unwrap();
        // The setup's 2 events and the calls'.
        assert_eq!((report.events_checked, report.first_problem), (202, None));
    }
}

on_both_backends! {
    /// An operation that fails after writing rows is rolled back alone (the batch is replayed
    /// with savepoints), while the operations around it commit.
    async fn a_failing_operation_is_rolled_back_alone(backend: Backend) {
        let db = seeded(backend, 1_000).await;
        let store = db.shared();
        store
            .record_call(new_call("acme", "run-1", "call-0", None))
            .await
            .unwrap();
        let tasks: Vec<_> = (1..=20)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let mut call = new_call("acme", "run-1", &format!("call-{i}"), None);
                    if i % 5 == 0 {
                        // The call row and the budget update succeed, then the decision id
                        // clashes.
                        call.decision.as_mut().unwrap().id = "dec-call-0".into();
                    }
                    (i, store.record_call(call).await)
                })
            })
            .collect();
        for task in tasks {
            let (i, result) = task.await.unwrap();
            if i % 5 == 0 {
                assert!(
                    matches!(&result, Err(LedgerError::AlreadyExists(what)) if what.contains("dec-call-0")),
                    "{i}: {result:?}"
                );
            } else {
                assert_eq!(result.unwrap(), RecordOutcome::Recorded, "{i}");
            }
        }
        if backend == Backend::Pg {
            // The refused calls fell back from PostgreSQL's fast forms.
            assert!(db.stats().step_by_step >= 4, "{:?}", db.stats());
        }
        let acme = tenant_id("acme");
        assert_eq!(
            store
                .get_tool_call(&acme, &call_id("call-5"))
                .await
                .unwrap(),
            None
        );
        let run_now = store
            .get_run(&acme, &run_id("run-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(run_now.calls_used, 17);
        let report = store.verify_chains().await.unwrap();
        // The setup's 2 events and the calls'.
        assert_eq!((report.events_checked, report.first_problem), (19, None));
    }
}

// --- durability --------------------------------------------------------------------------------

on_both_backends! {
    async fn writes_survive_reopening(backend: Backend) {
        let db = seeded(backend, 10).await;
        db.store()
            .record_call(new_call("acme", "run-1", "call-1", Some("use-1")))
            .await
            .unwrap();
        assert!(
            db.store()
                .finish_call(finish("acme", "call-1"))
                .await
                .unwrap()
        );
        let db = db.reopen().await;
        let acme = tenant_id("acme");
        let call = db
            .store()
            .get_tool_call(&acme, &call_id("call-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(call.status, ToolCallStatus::Succeeded);
        // The setup's 2 (tenant and agent created), requested and succeeded.
        assert_eq!(events_of(db.store(), "acme").await.len(), 4);

        // The chain continues from the stored head.
        db.store()
            .record_call(new_call("acme", "run-1", "call-2", Some("use-2")))
            .await
            .unwrap();
        let events = events_of(db.store(), "acme").await;
        assert_eq!(events.last().map(|e| e.chain_seq), Some(5));
        assert_eq!(db.store().verify_chains().await.unwrap().first_problem, None);

        // Dropping the store (no close) still leaves every acknowledged write stored.
        db.store()
            .append_events(vec![event("acme", "admin.note", "run-1", "call-2")])
            .await
            .unwrap();
        let db = db.reopen_without_close().await;
        assert_eq!(events_of(db.store(), "acme").await.len(), 6);
        assert_eq!(db.store().verify_chains().await.unwrap().first_problem, None);
        db.close().await;
        let closed = db.store().create_tenant(tenant("late"), &admin()).await;
        assert!(matches!(closed, Err(LedgerError::Closed)), "{closed:?}");
    }
}

on_both_backends! {
    /// `list_running_calls` lists the calls a stopped process left `running`, never the calls
    /// of the process asking (SQLite: the calls running when the store was opened; PostgreSQL:
    /// the calls whose owner no longer holds its lock).
    async fn running_calls_are_listed_once_their_process_is_gone(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        for id in ["call-1", "call-2", "call-3"] {
            store
                .record_call(new_call("acme", "run-1", id, None))
                .await
                .unwrap();
        }
        assert!(store.finish_call(finish("acme", "call-3")).await.unwrap());
        store
            .record_call(waiting_call("acme", "call-w", None))
            .await
            .unwrap();
        assert_eq!(
            ids(&store.list_running_calls(10).await.unwrap()),
            Vec::<String>::new(),
            "the calls of the process asking are not interrupted"
        );

        // A restart: the calls still running were interrupted.
        let db = db.reopen().await;
        let store = db.store();
        assert_eq!(
            ids(&store.list_running_calls(10).await.unwrap()),
            ["call-1", "call-2"]
        );
        assert_eq!(ids(&store.list_running_calls(1).await.unwrap()), ["call-1"]);

        // Calls of the new process are its own.
        store
            .record_call(new_call("acme", "run-1", "call-4", None))
            .await
            .unwrap();
        assert_eq!(
            ids(&store.list_running_calls(10).await.unwrap()),
            ["call-1", "call-2"]
        );

        // Settling one (as the engine does, with finish_call) removes it from the list.
        let mut unknown = finish("acme", "call-1");
        unknown.status = ToolCallStatus::OutcomeUnknown;
        unknown.error_code = Some(ErrorCode::OutcomeUnknown);
        assert!(store.finish_call(unknown).await.unwrap());
        assert_eq!(
            ids(&store.list_running_calls(10).await.unwrap()),
            ["call-2"]
        );

        // Another restart: the new process's call-4 was interrupted too.
        let db = db.reopen().await;
        assert_eq!(
            ids(&db.store().list_running_calls(10).await.unwrap()),
            ["call-2", "call-4"]
        );
    }
}

on_both_backends! {
    /// A call that was waiting for approval at a restart and is approved afterwards runs in the
    /// new process: it is that process's call, not an interrupted one.
    ///
    /// KNOWN FAILURE on SQLite (reported; store code not changed by the tests): `SqliteStore`
    /// lists every running call with `seq <= MAX(seq)` at open, which includes a call that was
    /// `waiting_approval` at open and approved later, so the 30 s sweep
    /// (`recover_interrupted_calls`) can settle a call as `outcome_unknown` while its connector
    /// runs. PostgreSQL passes: the approval makes the approving store the call's owner.
    async fn a_call_approved_after_a_restart_is_not_interrupted(backend: Backend) {
        let db = seeded(backend, 10).await;
        db.store()
            .record_call(waiting_call("acme", "call-w", Some("use-w")))
            .await
            .unwrap();
        let db = db.reopen().await;
        let store = db.store();
        assert!(store.list_running_calls(10).await.unwrap().is_empty());
        assert!(
            store
                .resolve_pending(decide("call-w", 1, true, "approver"))
                .await
                .unwrap()
        );
        let call = store
            .get_tool_call(&tenant_id("acme"), &call_id("call-w"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(call.status, ToolCallStatus::Running);
        assert_eq!(
            ids(&store.list_running_calls(10).await.unwrap()),
            Vec::<String>::new(),
            "the call this process is running now was listed as interrupted"
        );

        // Once this process is gone too, it is interrupted.
        let db = db.reopen().await;
        assert_eq!(
            ids(&db.store().list_running_calls(10).await.unwrap()),
            ["call-w"]
        );
    }
}

// --- approvals ---------------------------------------------------------------------------------

on_both_backends! {
    async fn of_concurrent_decisions_on_one_pending_row_exactly_one_claims_it(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.shared();
        assert_eq!(
            store
                .record_call(waiting_call("acme", "call-p", Some("use-p")))
                .await
                .unwrap(),
            RecordOutcome::Recorded
        );
        let acme = tenant_id("acme");
        let listed = store
            .list_pending(&acme, &PendingFilter::default(), 10)
            .await
            .unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            listed[0].arguments,
            PendingArguments::Sealed {
            key_id: "k1".to_owned(),
            sealed: "tgs1.k1.sealed-arguments".to_owned(),
        },
            "sealed arguments are stored and read back as they were given"
        );
        let filtered = PendingFilter {
            run: Some(run_id("other")),
            ..PendingFilter::default()
        };
        assert!(
            store
                .list_pending(&acme, &filtered, 10)
                .await
                .unwrap()
                .is_empty()
        );

        let observed = listed[0].version;
        let mut tasks = Vec::new();
        for i in 0..16 {
            let store = Arc::clone(&store);
            tasks.push(tokio::spawn(async move {
                let mut decision = decide("call-p", observed, i % 2 == 0, &format!("approver-{i}"));
                decision.events = vec![event("acme", "tool_call.decided", "run-1", "call-p")];
                store.resolve_pending(decision).await.unwrap()
            }));
        }
        let mut claimed = 0;
        for task in tasks {
            if task.await.unwrap() {
                claimed += 1;
            }
        }
        assert_eq!(claimed, 1, "exactly one decision claims the row");
        let row = store
            .get_pending(&acme, "pend-call-p")
            .await
            .unwrap()
            .unwrap();
        assert_ne!(row.state, PendingState::Pending);
        assert_eq!(row.version, observed + 1);
        assert_eq!(
            row.arguments,
            PendingArguments::Dropped,
            "arguments are dropped once decided"
        );
        assert!(
            store
                .list_pending(&acme, &PendingFilter::default(), 10)
                .await
                .unwrap()
                .is_empty()
        );
        let run = store
            .get_run(&acme, &run_id("run-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((run.pending_approvals, run.status), (0, RunStatus::Active));
        let decided = events_of(store.as_ref(), "acme")
            .await
            .into_iter()
            .filter(|e| e.kind == "tool_call.decided")
            .count();
        assert_eq!(decided, 1, "losers wrote no events");
        assert!(store.verify_chains().await.unwrap().first_problem.is_none());
    }
}

on_both_backends! {
    /// Expiry listing, a claim on a stale version, and a pending invocation added to an
    /// existing call (an approved execution that failed).
    async fn expired_and_added_pending_invocations(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let acme = tenant_id("acme");
        assert_eq!(
            store.pending_summary().await.unwrap(),
            PendingSummary::default(),
            "nothing pending"
        );
        store
            .record_call(waiting_call("acme", "call-1", None))
            .await
            .unwrap();
        assert_eq!(
            store.pending_summary().await.unwrap(),
            PendingSummary {
                count: 1,
                oldest_created_at: Some(pending("acme", "call-1").created_at),
            }
        );
        let expires = pending("acme", "call-1").expires_at;
        assert!(
            store
                .list_expired_pending(Timestamp(expires.0 - 1), 10)
                .await
                .unwrap()
                .is_empty()
        );
        let expired = store.list_expired_pending(expires, 10).await.unwrap();
        assert_eq!(
            expired.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["pend-call-1"]
        );

        // A decision on a version nobody observed claims nothing and writes nothing.
        let events_before = events_of(store, "acme").await.len();
        assert!(
            !store
                .resolve_pending(decide("call-1", 7, true, "approver"))
                .await
                .unwrap()
        );
        assert_eq!(events_of(store, "acme").await.len(), events_before);
        assert!(
            store
                .resolve_pending(decide("call-1", 1, true, "approver"))
                .await
                .unwrap()
        );
        assert!(
            store
                .list_expired_pending(expires, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(store.pending_summary().await.unwrap().count, 0, "decided");
        let run_now = store
            .get_run(&acme, &run_id("run-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (run_now.status, run_now.pending_approvals),
            (RunStatus::Active, 0)
        );

        // The approved execution failed: a fresh pending invocation for the same call.
        let retry = PendingInvocation {
            id: "pend-call-1-retry".into(),
            origin: PendingOrigin::ExecutionFailed,
            ..pending("acme", "call-1")
        };
        store
            .add_pending(
                retry.clone(),
                vec![event("acme", "tool_call.approval_requested", "run-1", "call-1")],
            )
            .await
            .unwrap();
        let run_now = store
            .get_run(&acme, &run_id("run-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (run_now.status, run_now.pending_approvals),
            (RunStatus::WaitingApproval, 1)
        );
        let failed_only = PendingFilter {
            origin: Some(PendingOrigin::ExecutionFailed),
            ..PendingFilter::default()
        };
        assert_eq!(
            store.list_pending(&acme, &failed_only, 10).await.unwrap(),
            vec![retry]
        );
        assert_eq!(
            store
                .get_pending(&tenant_id("beta"), "pend-call-1-retry")
                .await
                .unwrap(),
            None,
            "another tenant's pending invocation is invisible"
        );
        // A pending invocation for a call that does not exist is refused, with nothing written.
        let orphan = PendingInvocation {
            id: "pend-orphan".into(),
            ..pending("acme", "call-404")
        };
        let refused = store
            .add_pending(
                orphan,
                vec![event("acme", "tool_call.approval_requested", "run-1", "call-404")],
            )
            .await;
        assert!(matches!(refused, Err(LedgerError::NotFound(_))), "{refused:?}");
        let report = store.verify_chains().await.unwrap();
        assert_eq!(report.first_problem, None);
        // The setup's 2 events and the calls'.
        assert_eq!(report.events_checked, 6);
    }
}

on_both_backends! {
    /// A decision that lets the run continue without the call: the row is `continued`, the
    /// call `blocked` with `SKIPPED`, and the run no longer waits.
    async fn a_pending_invocation_can_be_continued_without_running(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let acme = tenant_id("acme");
        store
            .record_call(waiting_call("acme", "call-1", None))
            .await
            .unwrap();
        let decision = ResolvePending {
            state: PendingState::Continued,
            call_status: ToolCallStatus::Blocked,
            error_code: Some(ErrorCode::Skipped),
            error_text: Some("the call was not executed".into()),
            events: vec![event("acme", "tool_call.continued", "run-1", "call-1")],
            ..decide("call-1", 1, false, "approver")
        };
        assert!(store.resolve_pending(decision).await.unwrap());
        let row = store.get_pending(&acme, "pend-call-1").await.unwrap().unwrap();
        assert_eq!((row.state, row.version), (PendingState::Continued, 2));
        let call = store
            .get_tool_call(&acme, &call_id("call-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (call.status, call.error_code, call.error_text.as_deref()),
            (
                ToolCallStatus::Blocked,
                Some(ErrorCode::Skipped),
                Some("the call was not executed")
            )
        );
        let run_now = store
            .get_run(&acme, &run_id("run-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (run_now.status, run_now.pending_approvals),
            (RunStatus::Active, 0)
        );
        assert_eq!(
            events_of(store, "acme").await.pop().map(|e| e.kind).as_deref(),
            Some("tool_call.continued")
        );
        assert_eq!(store.verify_chains().await.unwrap().first_problem, None);
    }
}

// --- audit chain -------------------------------------------------------------------------------

on_both_backends! {
    async fn clean_chains_verify(backend: Backend) {
        let db = two_chains(backend).await;
        let report = db.store().verify_chains().await.unwrap();
        assert_eq!(
            (report.events_checked, report.chains_checked, report.first_problem.clone()),
            (11, 2, None)
        );
        let events = events_of(db.store(), "acme").await;
        assert_eq!(
            events.iter().map(|e| e.chain_seq).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6, 7]
        );
        assert_eq!(events[0].prev_hash, crate::GENESIS_HASH);
        for pair in events.windows(2) {
            assert_eq!(pair[1].prev_hash, pair[0].hash);
        }
        // Each event's stored hash is the one the ledger computes.
        for stored in &events {
            let payload = stored.payload.to_string();
            assert_eq!(
                stored.hash,
                crate::event_hash(
                    &stored.prev_hash,
                    &crate::EventFields {
                        tenant: stored.tenant.as_str(),
                        chain_seq: stored.chain_seq,
                        kind: &stored.kind,
                        run: stored.run.as_ref().map(|r| r.as_str()),
                        tool_call_id: stored.tool_call_id.as_ref().map(|c| c.as_str()),
                        payload: &payload,
                        at: stored.at.0,
                        binding: None,
                    },
                )
            );
        }
    }
}

on_both_backends! {
    /// Verification reads each chain in one snapshot: appends committing meanwhile never look
    /// like damage, and a reader following the chain with a cursor never skips an event (chain
    /// order is commit order).
    async fn readers_see_whole_commits_while_appends_go_on(backend: Backend) {
        let db = seeded(backend, 10).await;
        db.store().create_tenant(tenant("beta"), &admin()).await.unwrap();
        let store = db.shared();
        let writers: Vec<_> = (0..6)
            .map(|w| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    for i in 0..25 {
                        store
                            .append_events(vec![note("acme", w * 100 + i), note("beta", i)])
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        // The setup's 2 events (tenant and agent created), then the writers' 150 notes.
        let total = 152;

        let mut cursor = 0;
        while cursor < total {
            let page = store
                .list_events(&tenant_id("acme"), cursor, 1_000)
                .await
                .unwrap();
            let seqs: Vec<i64> = page.iter().map(|e| e.chain_seq).collect();
            let len = i64::try_from(seqs.len()).unwrap();
            assert_eq!(
                seqs,
                ((cursor + 1)..=(cursor + len)).collect::<Vec<_>>(),
                "a page after {cursor} skipped an event"
            );
            cursor += len;
            let report = store.verify_chains().await.unwrap();
            assert_eq!(report.first_problem, None, "{report:?}");
        }
        for writer in writers {
            writer.await.unwrap();
        }
        let report = store.verify_chains().await.unwrap();
        // 150 notes on each chain and the 3 creation events (acme, its agent, beta).
        assert_eq!((report.events_checked, report.first_problem), (303, None));
    }
}

on_both_backends! {
    async fn events_are_listed_from_a_cursor(backend: Backend) {
        let db = two_chains(backend).await;
        let store = db.store();
        let acme = tenant_id("acme");
        let page: Vec<i64> = store
            .list_events(&acme, 2, 2)
            .await
            .unwrap()
            .iter()
            .map(|e| e.chain_seq)
            .collect();
        assert_eq!(page, [3, 4]);
        store
            .append_events(vec![note("acme", 6)])
            .await
            .unwrap();
        // Only run-1's events, after the cursor; the note belongs to no run.
        let run_events: Vec<i64> = store
            .list_run_events(&acme, &run_id("run-1"), 5, 10)
            .await
            .unwrap()
            .iter()
            .map(|e| e.chain_seq)
            .collect();
        assert_eq!(run_events, [6, 7]);
        assert!(
            store
                .list_run_events(&tenant_id("beta"), &run_id("run-1"), 0, 10)
                .await
                .unwrap()
                .is_empty()
        );
        let beta = events_of(store, "beta").await;
        assert_eq!(beta.len(), 4);
        assert_eq!(beta[0].kind, "admin.tenant_created");
        assert_eq!(beta[1].payload, json!({ "n": 1 }));
    }
}

on_both_backends! {
    async fn appending_events(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        store.append_events(Vec::new()).await.unwrap();
        let many: Vec<NewAuditEvent> = (0..10)
            .map(|i| NewAuditEvent {
                payload: json!({ "i": i }),
                ..event("acme", "admin.note", "run-1", "x")
            })
            .collect();
        store.append_events(many).await.unwrap();
        // Any number of appends is one statement on PostgreSQL, one transaction without
        // savepoints on SQLite: no fallback.
        assert_eq!((db.stats().bulk_fallbacks, db.stats().step_by_step), (0, 0));
        let seqs: Vec<i64> = events_of(store, "acme")
            .await
            .into_iter()
            .map(|e| e.chain_seq)
            .collect();
        // After the setup's 2 events (tenant and agent created).
        assert_eq!(seqs, (1..=12).collect::<Vec<_>>());

        // An unknown tenant has no chain to join; nothing of the request is written.
        let stray = vec![
            event("acme", "admin.note", "run-1", "x"),
            event("nope", "admin.note", "run-1", "x"),
        ];
        assert_not_found(store.append_events(stray).await, "tenant nope");
        assert_eq!(events_of(store, "acme").await.len(), 12);
        let report = store.verify_chains().await.unwrap();
        assert_eq!((report.events_checked, report.first_problem), (12, None));
        // The chain goes on from where the refused request left it.
        store.append_events(vec![note("acme", 11)]).await.unwrap();
        let report = store.verify_chains().await.unwrap();
        assert_eq!((report.events_checked, report.first_problem), (13, None));
    }
}

// --- credentials -------------------------------------------------------------------------------

on_both_backends! {
    async fn credentials_are_stored_listed_replaced_and_deleted(backend: Backend) {
        use toolgate_core::SecretName;
        let db = Db::new(backend).await;
        let store = db.store();
        let acme = tenant_id("acme");
        store
            .create_tenant(
                Tenant {
                    id: acme.clone(),
                    name: "Acme".into(),
                    created_at: Timestamp(1),
                },
                &admin(),
            )
            .await
            .unwrap();
        let name = SecretName::new("slack_default").unwrap();
        let sealed = |value: &str, key: &str, at: i64| CredentialRecord {
            tenant: acme.clone(),
            name: name.clone(),
            kind: CredentialKind::Sealed,
            value: value.into(),
            key_id: Some(key.into()),
            metadata: serde_json::json!({"team": "support"}),
            notes: "bot token".into(),
            created_by: "tok_1".into(),
            created_at: Timestamp(at),
            updated_at: Timestamp(at),
        };
        store
            .put_credential(sealed("tgs1.k1.AAA", "k1", 10), &admin())
            .await
            .unwrap();
        store
            .put_credential(sealed("tgs1.k1.BBB", "k1", 20), &admin())
            .await
            .unwrap();
        let stored = store.get_credential(&acme, &name).await.unwrap().unwrap();
        assert_eq!(
            (stored.value.as_str(), stored.created_at, stored.updated_at),
            ("tgs1.k1.BBB", Timestamp(10), Timestamp(20))
        );
        assert_eq!(stored.metadata, serde_json::json!({"team": "support"}));
        assert_eq!(
            store.sealed_key_usage().await.unwrap(),
            vec![("k1".to_owned(), 1)]
        );
        assert_eq!(
            store.list_sealed_not_under("k2", 10).await.unwrap().len(),
            1
        );
        assert!(
            store
                .list_sealed_not_under("k1", 10)
                .await
                .unwrap()
                .is_empty()
        );
        // A rewrap loses to a concurrent update: the expected value no longer matches.
        assert!(
            !store
                .replace_sealed(
                    &acme,
                    &name,
                    "tgs1.k1.AAA",
                    "tgs1.k2.CCC",
                    "k2",
                    &Actor::token("tok-admin", Timestamp(30))
                )
                .await
                .unwrap()
        );
        assert!(
            store
                .replace_sealed(
                    &acme,
                    &name,
                    "tgs1.k1.BBB",
                    "tgs1.k2.CCC",
                    "k2",
                    &Actor::token("tok-admin", Timestamp(30))
                )
                .await
                .unwrap()
        );
        assert_eq!(
            store
                .get_credential(&acme, &name)
                .await
                .unwrap()
                .unwrap()
                .key_id
                .as_deref(),
            Some("k2")
        );
        // A reference is no sealed value: no key, never rewrapped.
        let reference = CredentialRecord {
            name: SecretName::new("aws_default").unwrap(),
            kind: CredentialKind::Reference,
            value: "env:AWS_KEY".into(),
            key_id: None,
            ..sealed("x", "k1", 40)
        };
        store.put_credential(reference.clone(), &admin()).await.unwrap();
        assert_eq!(
            store
                .list_credentials(&acme)
                .await
                .unwrap()
                .iter()
                .map(|c| c.name.as_str().to_owned())
                .collect::<Vec<_>>(),
            ["aws_default", "slack_default"]
        );
        assert_eq!(
            store.sealed_key_usage().await.unwrap(),
            vec![("k2".to_owned(), 1)]
        );
        let mut orphan = sealed("x", "k1", 1);
        orphan.tenant = tenant_id("nobody");
        assert!(matches!(
            store.put_credential(orphan, &admin()).await,
            Err(LedgerError::NotFound(_))
        ));
        store.delete_credential(&acme, &name, &admin()).await.unwrap();
        assert!(matches!(
            store.delete_credential(&acme, &name, &admin()).await,
            Err(LedgerError::NotFound(_))
        ));
        assert!(store.get_credential(&acme, &name).await.unwrap().is_none());
        assert_eq!(store.list_credentials(&acme).await.unwrap(), vec![reference]);
    }
}

on_both_backends! {
    /// A pending invocation keeps the timeout the agent asked for, whichever write path stores
    /// it (a call alone, calls batched together, an added invocation); NULL reads as the tool's
    /// default.
    async fn a_pending_invocation_keeps_the_requested_timeout(backend: Backend) {
        let db = seeded(backend, 100).await;
        let store = db.shared();
        let timeout_of = |i: u64| i.is_multiple_of(2).then(|| Duration::from_millis(100 + i));
        let mut tasks = Vec::new();
        for i in 0..8_u64 {
            let store = Arc::clone(&store);
            tasks.push(tokio::spawn(async move {
                let mut call = waiting_call("acme", &format!("call-{i}"), None);
                call.pending.as_mut().unwrap().timeout = timeout_of(i);
                store.record_call(call).await.unwrap()
            }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap(), RecordOutcome::Recorded);
        }
        let acme = tenant_id("acme");
        for i in 0..8_u64 {
            let row = store
                .get_pending(&acme, &format!("pend-call-{i}"))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(row.timeout, timeout_of(i), "call-{i}");
        }
        let retry = PendingInvocation {
            id: "pend-call-0-retry".into(),
            origin: PendingOrigin::ExecutionFailed,
            timeout: Some(Duration::from_millis(250)),
            ..pending("acme", "call-0")
        };
        store
            .add_pending(
                retry.clone(),
                vec![event("acme", "tool_call.approval_requested", "run-1", "call-0")],
            )
            .await
            .unwrap();
        assert_eq!(
            store.get_pending(&acme, "pend-call-0-retry").await.unwrap(),
            Some(retry)
        );
        let listed = store
            .list_pending(&acme, &PendingFilter::default(), 100)
            .await
            .unwrap();
        assert_eq!(listed.len(), 9);
        assert!(listed.iter().any(|row| row.timeout.is_none()));
    }
}

on_both_backends! {
    /// The migration that adds `timeout_ms` keeps the rows written before it: they read as the
    /// tool's default. (The column is dropped and its migration forgotten, then the store is
    /// opened again and migrates.)
    async fn the_timeout_migration_keeps_existing_pending_rows(backend: Backend) {
        let db = seeded(backend, 100).await;
        let store = db.store();
        store
            .record_call(waiting_call("acme", "call-1", None))
            .await
            .unwrap();
        let before = store
            .get_pending(&tenant_id("acme"), "pend-call-1")
            .await
            .unwrap()
            .unwrap();
        db.close().await;
        let version = match backend {
            Backend::Sqlite => "DELETE FROM _sqlx_migrations WHERE version = 7",
            Backend::Pg => "DELETE FROM _sqlx_migrations WHERE version = 4",
        };
        db.raw_execute("ALTER TABLE pending_invocations DROP COLUMN timeout_ms")
            .await;
        db.raw_execute(version).await;
        let db = db.reopen_without_close().await;
        let after = db
            .store()
            .get_pending(&tenant_id("acme"), "pend-call-1")
            .await
            .unwrap();
        assert_eq!(after, Some(before), "the row is kept, with no timeout");
    }
}

on_both_backends! {
    async fn pending_arguments_sealed_under_an_old_key_are_found_and_replaced(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.shared();
        store
            .record_call(waiting_call("acme", "call-p", Some("use-p")))
            .await
            .unwrap();
        assert_eq!(
            store.sealed_key_usage().await.unwrap(),
            [("k1".to_owned(), 1)],
            "a pending call's arguments need their key"
        );
        assert!(store.list_pending_sealed_not_under("k1", 10).await.unwrap().is_empty());
        let old = store.list_pending_sealed_not_under("k2", 10).await.unwrap();
        assert_eq!(old.len(), 1);
        let acme = tenant_id("acme");
        assert!(
            !store
                .replace_pending_arguments(&acme, "pend-call-p", Some("tgs1.k1.other"), "tgs1.k2.new", "k2")
                .await
                .unwrap(),
            "a replacement that did not see the current value changes nothing"
        );
        assert!(
            store
                .replace_pending_arguments(
                    &acme,
                    "pend-call-p",
                    Some("tgs1.k1.sealed-arguments"),
                    "tgs1.k2.new",
                    "k2"
                )
                .await
                .unwrap()
        );
        let row = store.get_pending(&acme, "pend-call-p").await.unwrap().unwrap();
        assert_eq!(
            row.arguments,
            PendingArguments::Sealed {
                key_id: "k2".to_owned(),
                sealed: "tgs1.k2.new".to_owned()
            }
        );
        assert_eq!(
            store.sealed_key_usage().await.unwrap(),
            [("k2".to_owned(), 1)]
        );
        // Once decided, nothing needs a key.
        assert!(
            store
                .resolve_pending(decide("call-p", row.version, false, "ops"))
                .await
                .unwrap()
        );
        assert!(store.sealed_key_usage().await.unwrap().is_empty());

        // Arguments kept in clear (by an older version) are found whatever the key, and
        // sealing them clears them.
        let mut clear = waiting_call("acme", "call-q", Some("use-q"));
        clear.pending.as_mut().unwrap().arguments =
            PendingArguments::Clear(json!({ "text": "deploy" }));
        store.record_call(clear).await.unwrap();
        let found = store.list_pending_sealed_not_under("k2", 10).await.unwrap();
        assert_eq!(found.len(), 1);
        assert!(matches!(found[0].arguments, PendingArguments::Clear(_)));
        assert!(
            store
                .replace_pending_arguments(&acme, "pend-call-q", None, "tgs1.k2.q", "k2")
                .await
                .unwrap()
        );
        let row = store.get_pending(&acme, "pend-call-q").await.unwrap().unwrap();
        assert_eq!(
            row.arguments,
            PendingArguments::Sealed {
                key_id: "k2".to_owned(),
                sealed: "tgs1.k2.q".to_owned()
            }
        );
        assert!(
            !store
                .replace_pending_arguments(&acme, "pend-call-q", None, "tgs1.k2.r", "k2")
                .await
                .unwrap(),
            "sealed arguments are not replaced as if they were clear"
        );
    }
}
