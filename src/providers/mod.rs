//! Models: the Anthropic Messages API ([`anthropic`]) and OpenAI-compatible
//! servers ([`openai`]) over a shared HTTP transport ([`http`]), replies
//! from a script ([`scripted`]), and the demo's offline models ([`demo`]).
//!
//! May import: [`crate::core`], [`crate::run`].

#[cfg(feature = "live")]
pub mod anthropic;
#[cfg(test)]
mod arbitrary;
pub(crate) mod body;
pub mod demo;
#[cfg(feature = "live")]
pub(crate) mod failure;
#[cfg(feature = "live")]
pub mod http;
pub mod openai;
pub mod scripted;
