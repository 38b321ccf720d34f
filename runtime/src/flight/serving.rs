//! What a serving worker does around each task of a query whose map files
//! stay on worker disks (`shuffle_durability: local`): before the task, it
//! starts its process's map server (once), serves the query's location and
//! tells the task its own server's address; after it, it signs the task's
//! report as the owner of the map file, so the driver hands readers its
//! address with the file's layout.
//!
//! A task of a query under `object_store` durability passes through as is.

use std::sync::Arc;

use dfx_abi::{MAP_SERVER, Plugin};

use crate::flight::MapServer;
use crate::protocol::envelope::Envelope;
use crate::protocol::report::Response;
use crate::spec::{DEFAULT_MAP_SERVER_BIND, ShuffleDurability};

/// Prepare `envelope`'s task: under `local` durability, the process's map
/// server, serving the task's location, with the task told its address.
/// `None` under `object_store`. `plugin`: the plugin whose map files the
/// worker serves; `None` for a worker that serves none.
///
/// # Errors
///
/// A server that cannot start, a location it cannot serve, or no plugin to
/// serve with: the task's failure, said.
pub fn before_task(
    plugin: Option<&Plugin>,
    envelope: &mut Envelope,
) -> Result<Option<Arc<MapServer>>, String> {
    let spec = &mut envelope.spec;
    if spec.shuffle_durability != ShuffleDurability::Local {
        return Ok(None);
    }
    let Some(location) = spec.shuffle_dir.clone() else {
        return Ok(None);
    };
    let bind = spec
        .map_server_bind
        .as_deref()
        .unwrap_or(DEFAULT_MAP_SERVER_BIND);
    let Some(plugin) = plugin else {
        return Err(format!(
            "stage {} map {}: the query keeps map files on worker disks (shuffle_durability \
             local), but this worker serves none; expected a worker of the dfx runtime's serve \
             loop",
            envelope.stage_id, envelope.partition
        ));
    };
    let server = MapServer::running(plugin, bind)?;
    server.serve(&location)?;
    spec.stage_options
        .insert(MAP_SERVER.to_string(), server.address().to_string());
    Ok(Some(server))
}

/// `response`, its map's layout signed with `server`'s address as the
/// file's owner when the task ran under `local` durability.
pub fn sign(mut response: Response, server: Option<&MapServer>) -> Response {
    if let (Response::Report(report), Some(server)) = (&mut response, server)
        && let Some(layout) = report.layout.as_mut()
    {
        layout.owner = Some(server.address().to_string());
    }
    response
}
