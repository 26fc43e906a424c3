//! The one helper templates get beyond handlebars' built-ins: `{{url x}}`, which renders `x`
//! only if it is an http(s) link. HTML escaping does not stop `href="javascript:…"`; this does.
//! It returns a value, so the registry escapes its output like any other `{{value}}`.

use handlebars::{
    Context, Handlebars, Helper, HelperDef, RenderContext, RenderError, RenderErrorReason,
    ScopedJson,
};
use serde_json::Value;

/// `{{url reset_url}}`: the value unchanged if it starts with `https://` or `http://`.
pub(super) struct UrlHelper;

impl HelperDef for UrlHelper {
    fn call_inner<'reg: 'rc, 'rc>(
        &self,
        h: &Helper<'rc>,
        _: &'reg Handlebars<'reg>,
        _: &'rc Context,
        _: &mut RenderContext<'reg, 'rc>,
    ) -> Result<ScopedJson<'rc>, RenderError> {
        let param = h
            .param(0)
            .ok_or(RenderErrorReason::ParamNotFoundForIndex("url", 0))?;
        if param.is_value_missing() {
            return Err(RenderError::strict_error(param.relative_path()));
        }
        let what = param
            .relative_path()
            .map_or_else(|| "its argument".to_owned(), |p| format!("variable {p:?}"));
        let refuse = |why: &str| RenderErrorReason::Other(format!("helper \"url\": {what} {why}"));
        match param.value() {
            Value::String(link) if is_web_link(link) => Ok(Value::String(link.clone()).into()),
            Value::String(_) => Err(refuse("is not an http(s) link").into()),
            _ => Err(refuse("is not a string").into()),
        }
    }
}

fn is_web_link(link: &str) -> bool {
    ["https://", "http://"].iter().any(|scheme| {
        link.get(..scheme.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(scheme))
    })
}
