//! What a dry run may assume beyond the engine as it is: the step's state kept on the device
//! (DTR's accounting, [`StateResidency`]), and recipes for ops the engine does not rebuild.
//!
//! The engine keeps recipes for pure elementwise ops only
//! ([`RECOMPUTABLE_OPS`](crate::policy::recompute::RECOMPUTABLE_OPS)). DTR rebuilds any op,
//! matrix products, views and reductions among them, and how much of the gap between
//! recompute-only and DTR's published overheads those would close is a question the planner
//! can answer before anyone builds them: [`RecipeClass`] names the ops of each class, and a dry
//! run under [`Assumptions::extra_recipes`] treats their outputs as the engine treats an
//! elementwise op's (the same memory rule, lineage, cost model and rebuild). These are
//! predictions for recipes that do not exist: the engine never drops such a tensor.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::state::StateResidency;
use crate::SpillError;

/// A class of ops the engine keeps no recipe for, which a dry run may assume it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecipeClass {
    /// Matrix products: `float_matmul`, and `linear` (with its bias).
    Matmul,
    /// Reductions along one dimension: `float_sum_dim`, `float_mean_dim`, `float_max_dim`.
    Reductions,
    /// Changes of shape or strides: `float_reshape`, `float_swap_dims`, `float_permute`,
    /// `float_expand`. On Flex and CubeCL most share their input's buffer, which the tape does
    /// not say: dropping one frees its bytes in the prediction, and on the device only when no
    /// other handle holds the buffer.
    Views,
    /// Convolutions: `conv1d`, `conv2d`, `conv3d`.
    Convolutions,
}

impl RecipeClass {
    /// Every class, in the order [`ACCEPTED`](Self::ACCEPTED) lists them.
    pub const ALL: [RecipeClass; 4] = [
        RecipeClass::Matmul,
        RecipeClass::Reductions,
        RecipeClass::Views,
        RecipeClass::Convolutions,
    ];

    /// The names `FromStr` accepts.
    pub const ACCEPTED: &'static str = "matmul, reductions, views, convolutions";

    /// The ops of this class, as Burn's ops traits name them (and the tape records them).
    pub fn ops(self) -> &'static [&'static str] {
        match self {
            RecipeClass::Matmul => &["float_matmul", "linear"],
            RecipeClass::Reductions => &["float_sum_dim", "float_mean_dim", "float_max_dim"],
            RecipeClass::Views => &[
                "float_reshape",
                "float_swap_dims",
                "float_permute",
                "float_expand",
            ],
            RecipeClass::Convolutions => &["conv1d", "conv2d", "conv3d"],
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for RecipeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecipeClass::Matmul => "matmul",
            RecipeClass::Reductions => "reductions",
            RecipeClass::Views => "views",
            RecipeClass::Convolutions => "convolutions",
        })
    }
}

impl FromStr for RecipeClass {
    type Err = SpillError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "matmul" | "matmuls" => Ok(RecipeClass::Matmul),
            "reductions" | "reduction" => Ok(RecipeClass::Reductions),
            "views" | "view" => Ok(RecipeClass::Views),
            "convolutions" | "convolution" | "conv" => Ok(RecipeClass::Convolutions),
            _ => Err(SpillError::InvalidValue {
                field: "recipe class",
                value: s.to_string(),
                accepted: Self::ACCEPTED,
            }),
        }
    }
}

/// A set of [`RecipeClass`]es.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtraRecipes(u8);

impl ExtraRecipes {
    /// No class: the engine's own recipes only.
    pub const NONE: ExtraRecipes = ExtraRecipes(0);

    /// Whether no class is assumed.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether `class` is assumed.
    pub fn contains(self, class: RecipeClass) -> bool {
        self.0 & class.bit() != 0
    }

    /// Whether the op named `name` belongs to an assumed class.
    pub fn covers(self, name: &str) -> bool {
        !self.is_empty()
            && RecipeClass::ALL
                .iter()
                .any(|&class| self.contains(class) && class.ops().contains(&name))
    }

    /// The assumed classes, in [`RecipeClass::ALL`]'s order.
    pub fn classes(self) -> impl Iterator<Item = RecipeClass> {
        RecipeClass::ALL
            .into_iter()
            .filter(move |&class| self.contains(class))
    }
}

impl FromIterator<RecipeClass> for ExtraRecipes {
    fn from_iter<I: IntoIterator<Item = RecipeClass>>(classes: I) -> Self {
        ExtraRecipes(classes.into_iter().fold(0, |bits, c| bits | c.bit()))
    }
}

impl fmt::Display for ExtraRecipes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<String> = self.classes().map(|c| c.to_string()).collect();
        f.write_str(&names.join(", "))
    }
}

/// What a dry run assumes beyond the engine as it runs. The default assumes nothing: the
/// prediction is the engine's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Assumptions {
    /// Whether the step's state may leave the device.
    pub state: StateResidency,
    /// Recipes assumed for ops the engine keeps none for.
    pub extra_recipes: ExtraRecipes,
}

impl From<StateResidency> for Assumptions {
    fn from(state: StateResidency) -> Self {
        Assumptions {
            state,
            ..Assumptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::recompute::is_recomputable;

    #[test]
    fn classes_parse_by_name_and_an_unknown_one_lists_the_accepted() {
        for class in RecipeClass::ALL {
            assert_eq!(class.to_string().parse::<RecipeClass>().unwrap(), class);
        }
        assert_eq!(
            " Conv ".parse::<RecipeClass>().unwrap(),
            RecipeClass::Convolutions
        );
        let err = "gathers".parse::<RecipeClass>().unwrap_err().to_string();
        assert!(err.contains("gathers"), "{err}");
        assert!(err.contains(RecipeClass::ACCEPTED), "{err}");
    }

    #[test]
    fn a_set_covers_the_ops_of_its_classes_only() {
        let extra: ExtraRecipes = [RecipeClass::Matmul, RecipeClass::Views]
            .into_iter()
            .collect();
        assert!(extra.covers("float_matmul") && extra.covers("linear"));
        assert!(extra.covers("float_reshape"));
        assert!(!extra.covers("float_sum_dim") && !extra.covers("conv2d"));
        assert!(
            !extra.covers("float_exp"),
            "an elementwise op is the engine's own"
        );
        assert!(!ExtraRecipes::NONE.covers("float_matmul"));
        assert_eq!(extra.to_string(), "matmul, views");
        assert_eq!(ExtraRecipes::NONE.to_string(), "none");
    }

    #[test]
    fn no_class_names_an_op_the_engine_already_rebuilds() {
        for class in RecipeClass::ALL {
            for op in class.ops() {
                assert!(!is_recomputable(op), "{op} of {class} has a recipe already");
            }
        }
    }
}
