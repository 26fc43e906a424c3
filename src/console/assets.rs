//! The console's static files, embedded in the binary: htmx (vendored from npm, see
//! `assets/vendor/htmx/README.md`) and the stylesheet. Each is served at a URL holding a hash of
//! its bytes with a year-long, immutable cache: a new binary's assets get new URLs.

use std::sync::LazyLock;

use axum::{
    extract::Path,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use sha2::{Digest, Sha256};

/// One embedded file.
struct Asset {
    /// The URL's file name, e.g. `htmx.min.3f2a….js`.
    name: String,
    content_type: &'static str,
    bytes: &'static [u8],
}

static HTMX: &[u8] = include_bytes!("../../assets/vendor/htmx/htmx.min.js");
static CSS: &[u8] = include_bytes!("../../assets/console.css");

static ASSETS: LazyLock<[Asset; 2]> = LazyLock::new(|| {
    [
        asset("htmx.min", "js", "text/javascript; charset=utf-8", HTMX),
        asset("console", "css", "text/css; charset=utf-8", CSS),
    ]
});

fn asset(stem: &str, ext: &str, content_type: &'static str, bytes: &'static [u8]) -> Asset {
    let hash = hex::encode(&Sha256::digest(bytes)[..8]);
    Asset {
        name: format!("{stem}.{hash}.{ext}"),
        content_type,
        bytes,
    }
}

/// The URL of htmx.
pub(super) fn htmx_url() -> String {
    format!("/console/assets/{}", ASSETS[0].name)
}

/// The URL of the stylesheet.
pub(super) fn css_url() -> String {
    format!("/console/assets/{}", ASSETS[1].name)
}

/// `GET /console/assets/{name}`: the file, cached for a year (its name changes with its bytes).
pub(super) async fn serve(Path(name): Path<String>) -> Response {
    let Some(asset) = ASSETS.iter().find(|a| a.name == name) else {
        return (StatusCode::NOT_FOUND, "no such asset").into_response();
    };
    (
        [
            (header::CONTENT_TYPE, asset.content_type),
            (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
        ],
        asset.bytes,
    )
        .into_response()
}
