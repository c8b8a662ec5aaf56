//! The JSON Schema (draft 2020-12) of the kit descriptor, generated from the typed configs.
//!
//! The committed `schema/kit.schema.json` is this output; a test fails when they drift.
//! The schema is documentation and editor help: `capgate validate` is the judge (some rules,
//! such as cross-entry checks and references, are beyond what a schema can say).

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};

use crate::caps::{KnownType, agent, credential, lifecycle, network, pack, ssh_agent, storage};

const TYPE_PATTERN: &str =
    "^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[a-z0-9]([a-z0-9-]*[a-z0-9])?@[1-9][0-9]*$";
const ARG_NAME_PATTERN: &str = "^[A-Za-z_][A-Za-z0-9_]*$";

fn config_schema(t: KnownType, generator: &mut SchemaGenerator) -> Option<Value> {
    fn of<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
        g.subschema_for::<T>().to_value()
    }
    Some(match t {
        KnownType::NetworkPolicyV1 => {
            let phase = json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "allow": {"type": "array", "items": {"type": "string", "minLength": 1}},
                    "deny": {"type": "array", "items": {"type": "string", "minLength": 1}}
                }
            });
            json!({
                "type": "object",
                "additionalProperties": false,
                "description": "Hosts the sandbox may reach, per phase (bounding needs network-policy@2).",
                "properties": {"install": phase.clone(), "runtime": phase}
            })
        }
        KnownType::NetworkPolicyV2 => of::<network::NetworkPolicy>(generator),
        KnownType::Credential => of::<credential::Credential>(generator),
        KnownType::SshAgent => of::<ssh_agent::SshAgent>(generator),
        KnownType::Volume => of::<storage::Volume>(generator),
        KnownType::HostMount => of::<storage::HostMount>(generator),
        KnownType::Port => of::<storage::Port>(generator),
        KnownType::UsbDevice => of::<storage::UsbDevice>(generator),
        KnownType::Resources => of::<storage::Resources>(generator),
        KnownType::Lifecycle => of::<lifecycle::Lifecycle>(generator),
        KnownType::AgentContext => of::<agent::AgentContext>(generator),
        KnownType::AgentSessions => of::<agent::AgentSessions>(generator),
        KnownType::AgentInteractiveSessions => of::<agent::AgentInteractiveSessions>(generator),
        KnownType::AgentSkills => of::<agent::AgentSkills>(generator),
        KnownType::AgentSkill => of::<agent::AgentSkill>(generator),
        KnownType::Acp => of::<agent::Acp>(generator),
        KnownType::Determinism => of::<pack::Determinism>(generator),
        KnownType::Egress => of::<pack::Egress>(generator),
        KnownType::Filesystem => of::<pack::Filesystem>(generator),
        KnownType::Exec => of::<pack::Exec>(generator),
        KnownType::Privileged
        | KnownType::LongRunning
        | KnownType::GitIdentity
        | KnownType::KitRegistry
        | KnownType::Sbx => return None,
    })
}

/// A `${{ kit.args.* }}` / `${{ kit.env.* }}` reference, which may stand where a typed
/// value belongs until create-time expansion (spec §1.7).
const REFERENCE_PATTERN: &str = r"\$\{\{\s*kit\.(args|env)\.[A-Za-z_][A-Za-z0-9_]*\s*\}\}";

/// Lets a reference stand in for every number and boolean of the typed configs: such an
/// entry is judged after expansion.
fn admit_references(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let typed = match map.get("type") {
                Some(Value::String(t)) => matches!(t.as_str(), "integer" | "number" | "boolean"),
                _ => false,
            };
            if typed {
                let original = Value::Object(std::mem::take(map));
                map.insert(
                    "anyOf".into(),
                    json!([original, {"type": "string", "pattern": REFERENCE_PATTERN}]),
                );
                return;
            }
            for child in map.values_mut() {
                admit_references(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(admit_references),
        _ => {}
    }
}

/// The descriptor schema as a JSON value.
pub fn descriptor_schema() -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let mut rules = Vec::new();
    for t in KnownType::ALL {
        let when = json!({"properties": {"type": {"const": t.name()}}, "required": ["type"]});
        let then = match config_schema(t, &mut generator) {
            Some(config) => json!({"properties": {"config": config}}),
            None => json!({"not": {"required": ["config"]}}),
        };
        rules.push(json!({"if": when, "then": then}));
    }
    rules.iter_mut().for_each(admit_references);
    let source = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["path"],
        "properties": {"kit": {"type": "string"}, "path": {"type": "string", "minLength": 1}}
    });
    let entry = json!({
        "type": "object",
        "description": "One capability request: a typed, versioned entry.",
        "additionalProperties": false,
        "required": ["type"],
        "properties": {
            "type": {"type": "string", "pattern": TYPE_PATTERN},
            "name": {"type": "string", "description": "Display label only; never identity."},
            "optional": {"type": "boolean", "default": false},
            "description": {"type": "string"},
            "config": {"description": "Type-specific payload; decoded strictly for well-known types."},
            "source": {"$ref": "#/$defs/Source"}
        },
        "allOf": rules
    });
    let member = {
        let mut m = entry.clone();
        if let Some(props) = m.get_mut("properties").and_then(Value::as_object_mut) {
            props.remove("optional");
        }
        m
    };
    let group = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["group"],
        "properties": {
            "group": {
                "type": "object",
                "additionalProperties": false,
                "required": ["capabilities"],
                "properties": {
                    "name": {"type": "string"},
                    "description": {"type": "string"},
                    "optional": {"type": "boolean"},
                    "capabilities": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/GroupMember"}}
                }
            },
            "source": {"$ref": "#/$defs/Source"}
        }
    });
    let arg = json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "default": {"type": "string"},
            "required": {"type": "boolean"},
            "description": {"type": "string"},
            "enum": {"type": "array", "items": {"type": "string"}},
            "pattern": {"type": "string", "description": "RE2 syntax, matched against the whole value."},
            "env": {"type": "string", "pattern": ARG_NAME_PATTERN},
            "buildArg": {"type": "string", "pattern": ARG_NAME_PATTERN}
        }
    });
    let kit = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["ref"],
        "properties": {
            "ref": {"type": "string", "minLength": 1},
            "digest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
            "args": {"type": "object", "propertyNames": {"pattern": ARG_NAME_PATTERN}, "additionalProperties": {"type": "string"}}
        }
    });
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let mut defs: Map<String, Value> = generator.take_definitions(true);
    defs.values_mut().for_each(admit_references);

    defs.insert("Source".into(), source);
    defs.insert("Capability".into(), entry);
    defs.insert("GroupMember".into(), member);
    defs.insert("Group".into(), group);
    defs.insert("Arg".into(), arg);
    defs.insert("Kit".into(), kit);
    let defs: Map<String, Value> = {
        let mut sorted: Vec<_> = defs.into_iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        sorted.into_iter().collect()
    };
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://capgate.dev/schema/kit.schema.json",
        "title": "Kit descriptor (kit specification v3)",
        "description": "A kit declares every capability its workload needs as typed, versioned entries.",
        "type": "object",
        "additionalProperties": false,
        "required": ["schemaVersion", "kind"],
        "properties": {
            "schemaVersion": {"const": "3"},
            "kind": {"enum": ["workload", "mixin", "set"]},
            "displayName": {"type": "string"},
            "author": {"type": "string"},
            "description": {"type": "string"},
            "sourceUrl": {"type": "string"},
            "iconUrl": {"type": "string", "description": "An absolute https URL."},
            "version": {"type": "string"},
            "licenses": strings,
            "provides": strings,
            "requires": strings,
            "integrates": strings,
            "conflicts": strings,
            "args": {"type": "object", "propertyNames": {"pattern": ARG_NAME_PATTERN}, "additionalProperties": {"$ref": "#/$defs/Arg"}},
            "build": {"type": "string"},
            "dockerfile": {"type": "string"},
            "kits": {"type": "array", "items": {"$ref": "#/$defs/Kit"}},
            "capabilities": {"type": "array", "items": {"oneOf": [{"$ref": "#/$defs/Capability"}, {"$ref": "#/$defs/Group"}]}}
        },
        "$defs": defs
    })
}
