//! The host's physical codec chain, byte-compatible with datafusion-python 55.
//!
//! A session carries several physical extension codecs: the plugin's (which
//! claims `ShuffleWriterExec` and `ShuffleReaderExec`) and DataFusion's
//! default (which claims nothing and writes nothing). A plan encoded by one
//! host must decode in the other — a stage written by the Python driver runs
//! in `dfx worker` and the other way round — so the chain frames payloads
//! exactly as datafusion-python 55 does.
//!
//! # Framing
//!
//! Each payload an *installed* codec writes (a node, a function definition,
//! an expression) is wrapped in an envelope naming the codec that wrote it:
//!
//! ```text
//! +-----------+---------+----------------+-----------------+-----------------+
//! | "DFPYCHN" | version | id length      | codec id        | codec's payload |
//! | 7 bytes   | u8 = 1  | u32 little end.| UTF-8, id length| the rest        |
//! +-----------+---------+----------------+-----------------+-----------------+
//! ```
//!
//! - **Encoding** asks the installed codecs in install order. The first that
//!   succeeds *and writes at least one byte* wins, and its bytes are framed
//!   with its id. A codec that fails, or succeeds writing nothing (the usual
//!   answer for "not mine" from a function hook), passes the turn on. When no
//!   installed codec claims the item, the terminal codec (DataFusion's
//!   default) is asked and its bytes, if any, are written unframed — so a plan
//!   with no extension content encodes to the same bytes as without a chain.
//! - **Decoding** looks for the envelope. A framed payload goes to the codec
//!   with that id and no other, stripped of the envelope; an id this session
//!   does not carry is an error naming it and the ids that are installed. An
//!   unframed payload goes to the terminal codec.
//!
//! The *codec ids* of a session are the installed codecs' ids in install
//! order; the terminal codec has none. A session built by
//! [`crate::session::build_session`] carries exactly the plugin's codec id
//! (`dfx_engine.physical.v5`), the list datafusion-python reports for
//! `SessionContext().with_extensions(...)` with the dfx extension.

use std::fmt;
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, HigherOrderUDF, ScalarUDF, WindowUDF};
use datafusion::physical_expr_common::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::physical_expr::proto_decode::PhysicalExprDecodeCtx;
use datafusion::physical_expr_common::physical_expr::proto_encode::PhysicalExprEncodeCtx;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{
    DefaultPhysicalExtensionCodec, PhysicalExtensionCodec, PhysicalProtoConverterExtension,
};

/// Marks a payload framed by a codec chain.
pub const FRAME_MAGIC: &[u8; 7] = b"DFPYCHN";

/// The frame layout this host writes and the only one it reads.
pub const FRAME_VERSION: u8 = 1;

/// A physical extension codec made of installed codecs (each with an id) and
/// a terminal codec. See the module docs for the framing.
pub struct CodecChain {
    links: Vec<(String, Arc<dyn PhysicalExtensionCodec>)>,
    terminal: Arc<dyn PhysicalExtensionCodec>,
}

impl fmt::Debug for CodecChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodecChain")
            .field("ids", &self.ids())
            .finish()
    }
}

impl Default for CodecChain {
    fn default() -> Self {
        Self::new(Arc::new(DefaultPhysicalExtensionCodec {}))
    }
}

impl CodecChain {
    /// A chain with no installed codec, ending in `terminal`.
    pub fn new(terminal: Arc<dyn PhysicalExtensionCodec>) -> Self {
        Self {
            links: Vec::new(),
            terminal,
        }
    }

    /// Install `codec` under `id`, after the codecs already installed.
    ///
    /// # Errors
    ///
    /// When `id` is empty or already installed: a payload names its codec by
    /// id, so two codecs sharing one could not be told apart on decode.
    pub fn with_codec(
        mut self,
        id: impl Into<String>,
        codec: Arc<dyn PhysicalExtensionCodec>,
    ) -> Result<Self> {
        let id = id.into();
        if id.is_empty() {
            return Err(DataFusionError::Configuration(
                "a codec installed on a chain needs a non-empty id".into(),
            ));
        }
        if id.len() > u32::MAX as usize {
            return Err(DataFusionError::Configuration(format!(
                "codec id of {} bytes does not fit the frame's u32 length",
                id.len()
            )));
        }
        if self.links.iter().any(|(installed, _)| *installed == id) {
            return Err(DataFusionError::Configuration(format!(
                "an extension codec with id '{id}' is already installed on this chain"
            )));
        }
        self.links.push((id, codec));
        Ok(self)
    }

    /// The codec installed under `id`.
    pub fn installed(&self, id: &str) -> Option<Arc<dyn PhysicalExtensionCodec>> {
        self.links
            .iter()
            .find(|(installed, _)| installed == id)
            .map(|(_, codec)| Arc::clone(codec))
    }

    /// Ids of the installed codecs, in install order (the terminal has none).
    pub fn ids(&self) -> Vec<String> {
        self.links.iter().map(|(id, _)| id.clone()).collect()
    }

    fn encode_with(
        &self,
        what: &str,
        buf: &mut Vec<u8>,
        encode: impl Fn(&dyn PhysicalExtensionCodec, &mut Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        let mut refusals = Vec::new();
        for (id, codec) in &self.links {
            let mut payload = Vec::new();
            match encode(codec.as_ref(), &mut payload) {
                Ok(()) if !payload.is_empty() => {
                    write_frame(buf, id, &payload);
                    return Ok(());
                }
                Ok(()) => {}
                Err(err) => refusals.push(format!("'{id}': {err}")),
            }
        }
        let mut payload = Vec::new();
        match encode(self.terminal.as_ref(), &mut payload) {
            Ok(()) => {
                buf.extend_from_slice(&payload);
                Ok(())
            }
            Err(err) if refusals.is_empty() => Err(err),
            Err(err) => Err(DataFusionError::Execution(format!(
                "no installed extension codec handled {what} (refused by {}; the default codec: {err})",
                refusals.join("; ")
            ))),
        }
    }

    fn decode_with<T>(
        &self,
        what: &str,
        buf: &[u8],
        decode: impl Fn(&dyn PhysicalExtensionCodec, &[u8]) -> Result<T>,
    ) -> Result<T> {
        match read_frame(buf)? {
            None => decode(self.terminal.as_ref(), buf),
            Some((id, payload)) => {
                let codec = self
                    .links
                    .iter()
                    .find(|(installed, _)| installed == id)
                    .map(|(_, codec)| codec)
                    .ok_or_else(|| {
                        let installed = if self.links.is_empty() {
                            "none".to_string()
                        } else {
                            self.ids().join(", ")
                        };
                        DataFusionError::Execution(format!(
                            "{what} was encoded by extension codec '{id}', which is not \
                             installed on this session (installed: {installed})"
                        ))
                    })?;
                decode(codec.as_ref(), payload)
            }
        }
    }
}

/// Append `payload` to `buf`, framed with `id`.
pub fn write_frame(buf: &mut Vec<u8>, id: &str, payload: &[u8]) {
    buf.extend_from_slice(FRAME_MAGIC);
    buf.push(FRAME_VERSION);
    // `with_codec` refuses ids longer than u32::MAX, so this cannot truncate.
    buf.extend_from_slice(&(id.len() as u32).to_le_bytes());
    buf.extend_from_slice(id.as_bytes());
    buf.extend_from_slice(payload);
}

/// Split a framed payload into the writing codec's id and its bytes;
/// `Ok(None)` for a payload that carries no frame.
///
/// # Errors
///
/// A frame that is truncated, of another version, or whose id is not UTF-8.
pub fn read_frame(buf: &[u8]) -> Result<Option<(&str, &[u8])>> {
    let Some(rest) = buf.strip_prefix(FRAME_MAGIC.as_slice()) else {
        return Ok(None);
    };
    let truncated = |what: &str| {
        DataFusionError::Execution(format!(
            "truncated extension codec payload ({} bytes): {what}",
            buf.len()
        ))
    };
    let (&version, rest) = rest
        .split_first()
        .ok_or_else(|| truncated("missing the frame version byte"))?;
    if version != FRAME_VERSION {
        return Err(DataFusionError::Execution(format!(
            "extension codec payload frame version v{version}; this host reads only \
             v{FRAME_VERSION}. Align the DataFusion hosts on both sides."
        )));
    }
    let (len, rest) = rest
        .split_first_chunk::<4>()
        .ok_or_else(|| truncated("missing the codec id length"))?;
    let len = u32::from_le_bytes(*len) as usize;
    if rest.len() < len {
        return Err(truncated("codec id shorter than its declared length"));
    }
    let (id, payload) = rest.split_at(len);
    let id = std::str::from_utf8(id).map_err(|err| {
        DataFusionError::Execution(format!(
            "extension codec payload carries a non-UTF-8 codec id: {err}"
        ))
    })?;
    Ok(Some((id, payload)))
}

impl PhysicalExtensionCodec for CodecChain {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.decode_with("an execution plan node", buf, |codec, payload| {
            codec.try_decode(payload, inputs, ctx, proto_converter)
        })
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let what = format!("the execution plan node {}", node.name());
        self.encode_with(&what, buf, |codec, out| {
            codec.try_encode(Arc::clone(&node), out, proto_converter)
        })
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.decode_with(&format!("scalar function {name}"), buf, |codec, payload| {
            codec.try_decode_udf(name, payload)
        })
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        let what = format!("scalar function {}", node.name());
        self.encode_with(&what, buf, |codec, out| codec.try_encode_udf(node, out))
    }

    fn try_decode_higher_order_function(
        &self,
        name: &str,
        buf: &[u8],
    ) -> Result<Arc<HigherOrderUDF>> {
        let what = format!("higher order function {name}");
        self.decode_with(&what, buf, |codec, payload| {
            codec.try_decode_higher_order_function(name, payload)
        })
    }

    fn try_encode_higher_order_function(
        &self,
        node: &HigherOrderUDF,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.encode_with("a higher order function", buf, |codec, out| {
            codec.try_encode_higher_order_function(node, out)
        })
    }

    fn try_decode_expr(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn PhysicalExpr>],
        ctx: &PhysicalExprDecodeCtx<'_>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        self.decode_with("a physical expression", buf, |codec, payload| {
            codec.try_decode_expr(payload, inputs, ctx)
        })
    }

    fn try_encode_expr(
        &self,
        node: &Arc<dyn PhysicalExpr>,
        buf: &mut Vec<u8>,
        ctx: &PhysicalExprEncodeCtx<'_>,
    ) -> Result<()> {
        self.encode_with("a physical expression", buf, |codec, out| {
            codec.try_encode_expr(node, out, ctx)
        })
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        let what = format!("aggregate function {name}");
        self.decode_with(&what, buf, |codec, payload| {
            codec.try_decode_udaf(name, payload)
        })
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        let what = format!("aggregate function {}", node.name());
        self.encode_with(&what, buf, |codec, out| codec.try_encode_udaf(node, out))
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> Result<Arc<WindowUDF>> {
        let what = format!("window function {name}");
        self.decode_with(&what, buf, |codec, payload| {
            codec.try_decode_udwf(name, payload)
        })
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        let what = format!("window function {}", node.name());
        self.encode_with(&what, buf, |codec, out| codec.try_encode_udwf(node, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The expected bytes are those datafusion-python 55.0.0 wrote around a
    // payload of a codec installed as "dfx_engine.physical.v1".
    #[test]
    fn frame_layout_matches_the_documented_one() {
        let mut buf = Vec::new();
        write_frame(&mut buf, "dfx_engine.physical.v1", b"xyz");
        let mut expected = b"DFPYCHN\x01\x16\x00\x00\x00".to_vec();
        expected.extend_from_slice(b"dfx_engine.physical.v1xyz");
        assert_eq!(buf, expected);
        assert_eq!(
            read_frame(&buf).unwrap(),
            Some(("dfx_engine.physical.v1", b"xyz".as_slice()))
        );
    }

    #[test]
    fn unframed_truncated_and_foreign_versions() {
        assert_eq!(read_frame(b"plain bytes").unwrap(), None);
        assert_eq!(read_frame(b"").unwrap(), None);
        for bad in [
            b"DFPYCHN".to_vec(),
            b"DFPYCHN\x01\x05\x00".to_vec(),
            b"DFPYCHN\x01\x05\x00\x00\x00abc".to_vec(),
        ] {
            let err = read_frame(&bad).unwrap_err().to_string();
            assert!(err.contains("truncated"), "{err}");
        }
        let err = read_frame(b"DFPYCHN\x09\x00\x00\x00\x00")
            .unwrap_err()
            .to_string();
        assert!(err.contains("v9"), "{err}");
        let err = read_frame(b"DFPYCHN\x01\x01\x00\x00\x00\xff")
            .unwrap_err()
            .to_string();
        assert!(err.contains("non-UTF-8"), "{err}");
    }

    #[test]
    fn duplicate_ids_are_refused() {
        let codec: Arc<dyn PhysicalExtensionCodec> = Arc::new(DefaultPhysicalExtensionCodec {});
        let chain = CodecChain::default()
            .with_codec("a", Arc::clone(&codec))
            .unwrap();
        assert!(chain.with_codec("a", codec).is_err());
    }
}
