//! `cargo xtask bench crd`: custom objects next to ConfigMaps on one API server (release
//! build, its own process and data directory, the embedded store; `--store etcd`: on a real
//! etcd member). A CustomResourceDefinition `widgets.bench.skiff.dev` with a structural
//! schema (types, a range, an enum, a length, a required field) and a CEL rule is created;
//! then `--objects` Widgets and as many ConfigMaps of about the same size are created by
//! `--clients` kube-rs clients, in chunks of 500 that alternate between the two kinds (so the
//! machine's noise and the growing store fall on both alike), and each kind is listed whole
//! in pages of 500 `--lists` times, alternating. The ConfigMaps are the baseline; the issue's
//! aim is custom objects within 1.3x of them (create p99, list throughput). Writes
//! bench-results/crd.{json,md} and crd-latency.svg (copied to docs/bench/).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;
use serde_json::json;
use skiff_launcher::apiserver::ApiServerProcess;
use skiff_tests::etcd::EtcdCluster;

use super::api::{self, ms, Sample};
use super::client;
use super::plot::{self, Chart, Series};
use crate::setup::root;

#[derive(clap::Args)]
pub struct Opts {
    /// Objects of each kind.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Concurrent clients creating.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Whole paged lists of each kind.
    #[arg(long, default_value_t = 5)]
    lists: usize,
    /// `embedded` (the default store) or `etcd` (one Debian etcd member on loopback).
    #[arg(long, value_enum, default_value_t = api::StoreArg::Embedded)]
    store: api::StoreArg,
}

const NAMESPACE: &str = "bench-crd";
/// Creates per chunk of one kind (a multiple of the default 16 clients: each does as many).
const CHUNK: usize = 512;
const PAGE: u32 = 500;
/// Issue 12's aim: custom objects within this factor of ConfigMaps.
const AIM: f64 = 1.3;

fn crd() -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.bench.skiff.dev"},
        "spec": {
            "group": "bench.skiff.dev", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {
                        "type": "object", "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 0, "maximum": 1000},
                            "color": {"type": "string", "enum": ["red", "green", "blue"]},
                            "note": {"type": "string", "maxLength": 100}
                        },
                        "x-kubernetes-validations": [{
                            "rule": "self.size >= 0 && self.color != 'red'",
                            "message": "red widgets are not sold"
                        }]
                    },
                    "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
                }}}
            }]
        }
    })
}

fn widgets() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("bench.skiff.dev", "v1", "Widget"),
        "widgets",
    )
}

/// A ConfigMap and a Widget carry the same strings: the difference measured is the kind's
/// path through the server, not the object's size.
fn configmap(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"bench": "crd"}},
        "data": {"color": "green", "note": "a small configuration value"},
    }))
    .expect("a valid ConfigMap")
}

fn widget(name: &str, size: usize) -> DynamicObject {
    DynamicObject::new(name, &widgets()).data(json!({
        "spec": {"size": size % 1000, "color": "green", "note": "a small configuration value"}
    }))
}

/// One kind's figures.
struct Kind {
    name: &'static str,
    creates: Sample,
    /// Each whole paged list's duration.
    lists: Vec<Duration>,
    /// Each page's latency.
    pages: Vec<Duration>,
    objects: usize,
}

impl Kind {
    fn list_rate(&self) -> f64 {
        let total: f64 = self.lists.iter().map(Duration::as_secs_f64).sum();
        (self.objects * self.lists.len()) as f64 / total.max(1e-9)
    }
    fn median_list(&self) -> Duration {
        let mut v = self.lists.clone();
        v.sort();
        v.get(v.len() / 2).copied().unwrap_or_default()
    }
    fn page_p99(&self) -> Duration {
        let mut v = self.pages.clone();
        v.sort();
        v.get(((v.len().max(1) - 1) as f64 * 0.99).round() as usize)
            .copied()
            .unwrap_or_default()
    }
}

pub fn run_bench(opts: Opts) -> Result<()> {
    let bin = api::release_control_plane()?;
    let scratch = api::tempdir()?.join("crd");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let etcd = (opts.store == api::StoreArg::Etcd).then(|| {
        eprintln!("bench crd: starting one etcd member (Debian's etcd on loopback)");
        EtcdCluster::start_with_default_elections(1)
    });
    let mut args = vec!["--bookmark-interval".to_string(), "60".to_string()];
    if let Some(e) = &etcd {
        args.extend(["--store".to_string(), e.url()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = ApiServerProcess::start(&bin, &scratch.join("data"), &args);
    let result = api::runtime()?.block_on(async {
        let c = client(&server.kubeconfig()).await?;
        measure(&c, &opts).await
    });
    drop(server);
    drop(etcd);
    let _ = std::fs::remove_dir_all(&scratch);
    report(&opts, result?)
}

/// Creates the definition and waits until it is Established and its objects are served.
async fn define(c: &Client) -> Result<()> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    let crds: Api<DynamicObject> = Api::all_with(c.clone(), &ar);
    let def: DynamicObject = serde_json::from_value(crd())?;
    crds.create(&PostParams::default(), &def).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let served: Api<DynamicObject> = Api::namespaced_with(c.clone(), NAMESPACE, &widgets());
    loop {
        let d = crds.get("widgets.bench.skiff.dev").await?;
        let established = d.data["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        });
        if established && served.list(&ListParams::default().limit(1)).await.is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the definition was not Established within 60 s: {}",
                d.data["status"]
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn measure(c: &Client, opts: &Opts) -> Result<[Kind; 2]> {
    api::namespace(c, NAMESPACE).await?;
    define(c).await?;
    // An invalid object is refused (the schema and the rule are live), so the creates below
    // are measured through validation, not around it.
    let wapi: Api<DynamicObject> = Api::namespaced_with(c.clone(), NAMESPACE, &widgets());
    let mut red = widget("red", 1);
    red.data["spec"]["color"] = json!("red");
    match wapi.create(&PostParams::default(), &red).await {
        Err(kube::Error::Api(e)) if e.code == 422 => {}
        other => bail!("a red widget should be refused with 422 by the CEL rule: {other:?}"),
    }
    let capi: Api<ConfigMap> = Api::namespaced(c.clone(), NAMESPACE);
    let chunks = opts.objects.div_ceil(CHUNK);
    let (mut cm_lat, mut w_lat) = (Vec::new(), Vec::new());
    let (mut cm_time, mut w_time) = (Duration::ZERO, Duration::ZERO);
    eprintln!(
        "bench crd: creating {} ConfigMaps and {} Widgets from {} clients, in alternating chunks of {CHUNK}",
        opts.objects, opts.objects, opts.clients
    );
    for k in 0..chunks {
        let n = CHUNK.min(opts.objects - k * CHUNK);
        let a = capi.clone();
        let s = api::drive("configmap", opts.clients, n, move |t, i| {
            let a = a.clone();
            async move {
                a.create(
                    &PostParams::default(),
                    &configmap(&format!("c-{k}-{t}-{i}")),
                )
                .await?;
                Ok(())
            }
        })
        .await?;
        cm_time += s.elapsed;
        cm_lat.extend(s.latencies);
        let a = wapi.clone();
        let s = api::drive("widget", opts.clients, n, move |t, i| {
            let a = a.clone();
            async move {
                a.create(
                    &PostParams::default(),
                    &widget(&format!("w-{k}-{t}-{i}"), k * CHUNK + i),
                )
                .await?;
                Ok(())
            }
        })
        .await?;
        w_time += s.elapsed;
        w_lat.extend(s.latencies);
        if (k + 1) % 4 == 0 || k + 1 == chunks {
            eprintln!(
                "bench crd: {} of each kind created",
                (k * CHUNK + n).min(opts.objects)
            );
        }
    }
    let objects = w_lat.len();
    if cm_lat.len() != objects {
        bail!("created {} ConfigMaps and {objects} Widgets", cm_lat.len());
    }
    let mut cm = Kind {
        name: "ConfigMap (v1, built in)",
        creates: Sample::of("configmap", cm_lat, cm_time),
        lists: Vec::new(),
        pages: Vec::new(),
        objects,
    };
    let mut w = Kind {
        name: "Widget (custom, schema + CEL)",
        creates: Sample::of("widget", w_lat, w_time),
        lists: Vec::new(),
        pages: Vec::new(),
        objects,
    };
    eprintln!(
        "bench crd: listing each kind whole {} times in pages of {PAGE}",
        opts.lists
    );
    for _ in 0..opts.lists {
        let (t, pages, n) = paged(&capi).await?;
        check(n, objects, "ConfigMaps")?;
        cm.lists.push(t);
        cm.pages.extend(pages);
        let (t, pages, n) = paged(&wapi).await?;
        check(n, objects, "Widgets")?;
        w.lists.push(t);
        w.pages.extend(pages);
    }
    Ok([cm, w])
}

fn check(listed: usize, objects: usize, what: &str) -> Result<()> {
    if listed != objects {
        bail!("a paged list returned {listed} {what}, {objects} were created");
    }
    Ok(())
}

/// A whole list in pages of [`PAGE`]: its duration, each page's latency, the items seen.
async fn paged<K>(api: &Api<K>) -> Result<(Duration, Vec<Duration>, usize)>
where
    K: Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let started = Instant::now();
    let (mut token, mut pages, mut items) = (None::<String>, Vec::new(), 0);
    loop {
        let mut lp = ListParams::default().limit(PAGE);
        if let Some(t) = token.take() {
            lp = lp.continue_token(&t);
        }
        let t0 = Instant::now();
        let l = api.list(&lp).await?;
        pages.push(t0.elapsed());
        items += l.items.len();
        match l.metadata.continue_.filter(|s| !s.is_empty()) {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    Ok((started.elapsed(), pages, items))
}

fn report(opts: &Opts, [cm, w]: [Kind; 2]) -> Result<()> {
    let store = match opts.store {
        api::StoreArg::Embedded => "the embedded store",
        api::StoreArg::Etcd => "one etcd member",
    };
    let mut md = format!(
        "One API server (release build, TLS, the admin's client certificate) on {store}. {} objects of each kind created by {} kube-rs clients in alternating chunks of {CHUNK}, then each kind listed whole {} times in pages of {PAGE}, alternating. ConfigMaps are the baseline; the Widgets' definition has a structural schema (required field, range, enum, maxLength) and a CEL rule, checked on every create.\n\n| kind | create p50 ms | create p99 ms | creates/s | whole list s (median) | objects listed/s | page p99 ms |\n|---|---:|---:|---:|---:|---:|---:|\n",
        cm.objects, opts.clients, opts.lists
    );
    for k in [&cm, &w] {
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.0} | {:.2} | {:.0} | {:.1} |\n",
            k.name,
            ms(k.creates.pct(0.5)),
            ms(k.creates.pct(0.99)),
            k.creates.rate(),
            k.median_list().as_secs_f64(),
            k.list_rate(),
            ms(k.page_p99()),
        ));
    }
    let p99_ratio = ms(w.creates.pct(0.99)) / ms(cm.creates.pct(0.99)).max(1e-9);
    let list_ratio = cm.list_rate() / w.list_rate().max(1e-9);
    let verdict = |r: f64| if r <= AIM { "within" } else { "outside" };
    md.push_str(&format!(
        "\nCustom vs built in (aim: within {AIM}x): create p99, custom over ConfigMaps, {p99_ratio:.2}x ({}); list throughput, ConfigMaps over custom, {list_ratio:.2}x ({}).\n",
        verdict(p99_ratio),
        verdict(list_ratio)
    ));
    println!("\n{md}");
    let row = |k: &Kind| {
        json!({"kind": k.name, "objects": k.objects,
            "create_p50_ms": ms(k.creates.pct(0.5)), "create_p99_ms": ms(k.creates.pct(0.99)),
            "creates_per_s": k.creates.rate(), "list_median_s": k.median_list().as_secs_f64(),
            "listed_per_s": k.list_rate(), "page_p99_ms": ms(k.page_p99())})
    };
    let out = json!({
        "store": format!("{:?}", opts.store).to_lowercase(), "clients": opts.clients,
        "chunk": CHUNK, "page": PAGE, "kinds": [row(&cm), row(&w)],
        "create_p99_ratio": p99_ratio, "list_throughput_ratio": list_ratio, "aim": AIM,
    });
    let quantiles = [0.5, 0.75, 0.9, 0.95, 0.99, 0.999];
    let series = |k: &Kind, color| Series {
        name: k.name.split(' ').next().unwrap_or(k.name).to_string(),
        color,
        points: quantiles
            .iter()
            .map(|&q| (q * 100.0, ms(k.creates.pct(q))))
            .collect(),
    };
    let svg = plot::svg(
        &Chart {
            title: "Create latency by percentile: custom objects vs ConfigMaps",
            x_label: "percentile",
            y_label: "ms",
            log_x: false,
            log_y: false,
        },
        &[series(&cm, "#1f77b4"), series(&w, "#d62728")],
    );
    let stem = match opts.store {
        api::StoreArg::Embedded => "crd",
        api::StoreArg::Etcd => "crd-etcd",
    };
    for dir in [root().join("bench-results"), root().join("docs/bench")] {
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        std::fs::write(
            dir.join(format!("{stem}.json")),
            serde_json::to_string_pretty(&out)?,
        )?;
        std::fs::write(dir.join(format!("{stem}.md")), &md)?;
        std::fs::write(dir.join(format!("{stem}-latency.svg")), &svg)?;
    }
    eprintln!(
        "bench crd: wrote bench-results/{stem}.{{json,md}}, {stem}-latency.svg (copied to docs/bench/)"
    );
    Ok(())
}
