//! What a serving worker does around each task of a query whose map files
//! stay on worker disks (`shuffle_durability` `local` or `both`): before
//! the task, it starts its process's map server (once), serves the query's
//! location (`local`) or a directory of copies (`both`, told to the task's
//! writer), and tells the task its own server's address; after it, it
//! signs the task's report as the owner of the map file, so the driver
//! hands readers its address with the file's layout.
//!
//! A task of a query under `object_store` durability passes through as is.

use std::sync::Arc;

use dfx_abi::{MAP_COPY_DIR, MAP_SERVER, Plugin};

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
) -> Result<Option<Served>, String> {
    let spec = &mut envelope.spec;
    if spec.shuffle_durability == ShuffleDurability::ObjectStore {
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
    let copies = match spec.shuffle_durability {
        ShuffleDurability::Local => {
            server.serve(&location)?;
            None
        }
        _ => {
            let dir = server.keep_copies(&location)?;
            spec.stage_options
                .insert(MAP_COPY_DIR.to_string(), dir.display().to_string());
            Some(plugin.map_path(&dir, envelope.stage_id, envelope.partition))
        }
    };
    spec.stage_options
        .insert(MAP_SERVER.to_string(), server.address().to_string());
    Ok(Some(Served {
        server,
        copy: copies,
    }))
}

/// A task's map served by its worker's map server.
pub struct Served {
    server: Arc<MapServer>,
    /// The copy of the map's file the task's writer keeps (`both`); `None`
    /// when the file itself is served (`local`).
    copy: Option<std::path::PathBuf>,
}

/// `response`, its map's layout signed with the address of the server that
/// holds its file: always under `local`, and under `both` only when the
/// task kept the copy (another attempt's file won the location otherwise,
/// and readers read that).
pub fn sign(mut response: Response, served: Option<&Served>) -> Response {
    let Some(served) = served else {
        return response;
    };
    if let Response::Report(report) = &mut response
        && let Some(layout) = report.layout.as_mut()
        && served.copy.as_ref().is_none_or(|copy| copy.is_file())
    {
        layout.owner = Some(served.server.address().to_string());
    }
    response
}

/// The end of a worker's serving: the copies it kept go.
pub fn after_serving() {
    if let Some(server) = MapServer::started() {
        server.drop_copies();
    }
}
