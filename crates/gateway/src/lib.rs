//! capgate-gateway: the sandbox's only way out. It applies the policy to every connection
//! and request, intercepts TLS where a rule needs to see requests, swaps credential
//! sentinels for real secrets only where granted, and never connects to a blocked address.
#![forbid(unsafe_code)]

pub mod secrets;

pub mod tls;

pub mod addr;

pub mod broker;
mod cleartext;
pub mod dns;
pub mod h1;
mod http2;
pub mod mask;
pub mod proxy;
pub mod respond;
pub mod socks;
mod splice;
mod stall;
