//! The whole create-time pipeline over a closed set of kits (spec §4.2): resolve, select,
//! compose, and judge the merged descriptor strictly; then project it onto the surface.

use capgate_spec::{Options, Profile};
use serde::Serialize;

use crate::compose::{Composed, Contribution, compose};
use crate::problem::Refusal;
use crate::resolve::{Resolution, Unit, resolve};
use crate::select::{self, Selection};
use crate::surface::{Surface, surface_of};

/// A coherent composition, ready to lock and enforce.
#[derive(Debug, Clone)]
pub struct Plan {
    pub resolution: Resolution,
    /// Each unit's selection, indexed like `resolution.units`.
    pub selections: Vec<Selection>,
    pub composed: Composed,
    /// The permission surface of the composition (selected and merged).
    pub surface: Surface,
}

/// An optional entry this runtime does not honour, left out of the composition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub kit: String,
    pub path: String,
    pub reason: String,
}

impl Plan {
    /// Kit references in layer order (the workload first).
    pub fn order(&self) -> Vec<&str> {
        self.resolution
            .layers
            .iter()
            .map(|&i| self.resolution.units[i].reference.as_str())
            .collect()
    }

    /// The units in layer order.
    pub fn layered_units(&self) -> impl Iterator<Item = &Unit> {
        self.resolution
            .layers
            .iter()
            .map(|&i| &self.resolution.units[i])
    }

    /// The units in layer order, each with its selection.
    pub fn layered_selections(&self) -> impl Iterator<Item = (&Unit, &Selection)> {
        self.resolution
            .layers
            .iter()
            .map(|&i| (&self.resolution.units[i], &self.selections[i]))
    }

    /// Every skipped item, in layer order.
    pub fn skipped(&self) -> Vec<Skipped> {
        self.resolution
            .layers
            .iter()
            .flat_map(|&i| {
                let reference = &self.resolution.units[i].reference;
                self.selections[i].skipped.iter().map(move |r| Skipped {
                    kit: reference.clone(),
                    path: r.path.clone(),
                    reason: r.reason(),
                })
            })
            .collect()
    }
}

/// Runs the pipeline; every problem of the composition is returned together.
pub fn plan(units: Vec<Unit>) -> Result<Plan, Vec<Refusal>> {
    let resolution = resolve(units)?;
    let mut refusals = Vec::new();
    let mut selections: Vec<Selection> = vec![Selection::default(); resolution.units.len()];
    for &i in &resolution.topological {
        let unit = &resolution.units[i];
        let (selection, refused) =
            select::select(&unit.reference, &unit.descriptor, &select::decide);
        refusals.extend(refused);
        selections[i] = selection;
    }
    if !refusals.is_empty() {
        return Err(refusals);
    }
    let contributions: Vec<Contribution<'_>> = resolution
        .topological
        .iter()
        .map(|&i| Contribution {
            reference: &resolution.units[i].reference,
            descriptor: &resolution.units[i].descriptor,
            entries: selections[i]
                .entries
                .iter()
                .map(|(p, e)| (p.clone(), e))
                .collect(),
        })
        .collect();
    let composed = compose(&contributions)?;
    let merged = composed.descriptor();
    // The merged descriptor must be a valid effective descriptor: this is where checks that
    // span kits (a credential's inject domains inside some kit's allow list) are judged.
    let tree = serde_json::to_value(&merged).map_err(|e| {
        vec![Refusal::new(format!(
            "the merged descriptor cannot be written: {e}"
        ))]
    })?;
    let judged = capgate_spec::load_tree(
        &capgate_spec::node::Node::from_json(&tree),
        &Options {
            profile: Profile::Effective,
            ..Options::default()
        },
    );
    let problems: Vec<Refusal> = judged
        .diagnostics
        .errors()
        .map(|d| Refusal {
            kit: None,
            path: (!d.path.is_root()).then(|| format!("merged {}", d.path)),
            message: d.message.clone(),
        })
        .collect();
    if !problems.is_empty() {
        return Err(problems);
    }
    let surface = judged
        .descriptor
        .as_ref()
        .map_or_else(|| surface_of(&merged), surface_of);
    Ok(Plan {
        resolution,
        selections,
        composed,
        surface,
    })
}
