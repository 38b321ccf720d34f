//! `dfx explain`: the physical plan of each query, each stage marked with
//! its id, maps, buckets and deps. Plans only: nothing runs.

use clap::Args;
use dfx_host::{Host, Result, load_plugin};
use dfx_runtime::spec::Script;

use super::query::{QueryArgs, shuffle_dir, spec_of};

#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    query: QueryArgs,
}

/// Run `dfx explain`: print each query's plan with its stages marked.
pub async fn explain(args: ExplainArgs) -> Result<()> {
    let script = Script::parse(&args.query.sql()?)?;
    let plugin = load_plugin(args.query.plugin.as_deref())?;
    let host = Host::new(plugin)?;
    let mut spec = spec_of(&args.query, &script)?;
    // Planning writes nothing, so a temporary directory is only a name here.
    let (dir, _temp) = shuffle_dir(args.query.shuffle_dir.as_deref())?;
    if !args.query.local {
        spec = spec.with_shuffle_dir(dir);
    }
    for sql in &script.queries {
        let rendered = host.explain(sql, &spec).await?;
        print!("{rendered}");
        if !args.query.local && !rendered.contains(host.plugin().stage_node_name()) {
            // Said, so an uncut plan is not read as one dfx failed to cut.
            eprintln!(
                "no stage: the driver runs this plan whole (a plan no wider than a task \
                 is not cut; --set collapse_stages=task runs it on a worker)"
            );
        }
    }
    Ok(())
}
