//! `probe_host` describes this machine, and a start that needs what the host lacks fails
//! with the explanation.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
mod common;

use capgate_sandbox::{Availability, Feature, SandboxError, WorkspaceMode, probe_host};
use common::*;

#[test]
fn the_report_covers_every_feature_and_explains_what_is_missing() {
    let report = probe_host();
    for feature in [
        Feature::UserNamespaces,
        Feature::IdMapping,
        Feature::Landlock,
        Feature::Seccomp,
        Feature::PidsLimit,
        Feature::MemoryLimit,
        Feature::CpuLimit,
        Feature::Overlay,
        Feature::Proc,
    ] {
        let check = report
            .check(feature)
            .unwrap_or_else(|| panic!("{feature:?} missing from the report"));
        assert!(!check.detail.is_empty());
        if check.availability != Availability::Available {
            // Anything short of available says how to fix it or what still holds.
            assert!(check.detail.len() > 40, "{feature:?}: {}", check.detail);
        }
    }
    // What this crate's tests need; on a host without it they fail here, with the report.
    for feature in [
        Feature::UserNamespaces,
        Feature::IdMapping,
        Feature::Seccomp,
        Feature::PidsLimit,
        Feature::Proc,
    ] {
        assert_eq!(
            report.check(feature).unwrap().availability,
            Availability::Available,
            "this host cannot run the sandbox tests:\n{report}"
        );
    }
}

#[test]
fn a_missing_controller_fails_the_start_with_its_explanation_or_warns_when_skipped() {
    // A limit on a controller this host lacks is only testable where one is missing; where
    // both exist, the report says so and the start applies both.
    let report = probe_host();
    let memory = report.check(Feature::MemoryLimit).unwrap().clone();
    let mut s = setup("probe-mem", WorkspaceMode::Copy);
    s.spec.limits.memory = Some(256 << 20);
    match (
        memory.availability,
        capgate_sandbox::Sandbox::start(&s.spec, &helper()),
    ) {
        (Availability::Missing, Err(SandboxError::Unavailable { explanation, .. })) => {
            assert!(
                explanation.contains("--dangerously-skip-limits"),
                "{explanation}"
            );
            s.spec.limits.skip_unavailable = true;
            let (sandbox, _) = capgate_sandbox::Sandbox::start(&s.spec, &helper()).unwrap();
            assert!(
                sandbox
                    .report()
                    .warnings
                    .iter()
                    .any(|w| w.contains("NOT enforced"))
            );
            sandbox.stop().unwrap();
        }
        (Availability::Available | Availability::Partial, Ok((sandbox, _))) => {
            assert_eq!(sandbox.report().cgroups.len(), 2, "{:?}", sandbox.report());
            sandbox.stop().unwrap();
        }
        (a, r) => panic!(
            "the report says {a:?} ({}) but start gave {:?}",
            memory.detail,
            r.map(|_| ())
        ),
    }
}

#[test]
fn a_fully_equipped_host_reports_landlock_in_the_start_report() {
    let s = setup("probe-ll", WorkspaceMode::Copy);
    let b = start(&s.spec);
    let ll = &b.sandbox.report().landlock;
    let abi = probe_host();
    let landlock = abi.check(Feature::Landlock).unwrap();
    match landlock.availability {
        Availability::Available => {
            assert_eq!(
                ll.enforcement,
                capgate_sandbox::LandlockEnforcement::Fully,
                "{ll:?}"
            );
            assert!(ll.tcp_connect_restricted && ll.scoped && ll.audit_logging && ll.no_new_privs);
            assert!(
                b.sandbox.report().warnings.is_empty(),
                "{:?}",
                b.sandbox.report().warnings
            );
        }
        _ => assert!(
            !b.sandbox.report().warnings.is_empty(),
            "a weaker Landlock must be reported"
        ),
    }
    b.sandbox.stop().unwrap();
}

#[test]
fn invalid_specs_are_refused_before_anything_starts() {
    let mut s = setup("probe-bad", WorkspaceMode::Copy);
    s.spec.name = "Bad Name".into();
    let e = capgate_sandbox::Sandbox::start(&s.spec, &helper()).unwrap_err();
    assert!(
        matches!(e, SandboxError::InvalidSpec { field: "name", .. }),
        "{e}"
    );
    let mut s = setup("probe-nows", WorkspaceMode::Mount);
    s.spec.workspace.host_dir = s.dir.path().join("missing");
    let e = capgate_sandbox::Sandbox::start(&s.spec, &helper()).unwrap_err();
    assert!(e.to_string().contains("is not a directory"), "{e}");
}
