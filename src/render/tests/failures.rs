//! Refusals at render time: each names the kind, file, line and cause, and none carries the
//! rendered content or the offending value.

use serde_json::json;

use super::{fixture_with, sample_with, sample_without, shipped};
use crate::render::{RenderError, Templates};

#[test]
fn missing_variable_names_the_variable_file_and_line() {
    let data = sample_without("order_confirmation", "/order", "total");
    let error = shipped()
        .render("order_confirmation", None, &data)
        .unwrap_err();

    assert!(matches!(
        &error,
        RenderError::Template { kind, file, line: Some(_), column: Some(_), message }
            if kind == "order_confirmation" && file == "html.hbs" && message.contains("order.total")
    ));
    assert_eq!(
        error.to_string(),
        "template \"order_confirmation\" html.hbs line 23: variable \"order.total\" not found in the job data"
    );
}

#[test]
fn missing_field_of_a_list_item_is_reported_inside_the_loop() {
    let mut data = shipped().sample("order_confirmation").unwrap().clone();
    data["order"]["items"][1]
        .as_object_mut()
        .unwrap()
        .remove("price");
    let error = shipped()
        .render("order_confirmation", None, &data)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "template \"order_confirmation\" html.hbs line 18: variable \"price\" not found in the job data"
    );
}

#[test]
fn missing_variable_used_by_a_layout_names_the_layout_file() {
    let dir = fixture_with(&[
        (
            "layouts/frame.hbs",
            "<body>\n<h1>{{brand}}</h1>\n{{> @partial-block}}</body>\n",
        ),
        (
            "k/html.hbs",
            "{{#> layouts/frame}}<p>Hello {{name}}</p>{{/layouts/frame}}",
        ),
        ("k/sample.json", r#"{"name": "Ada", "brand": "Acme"}"#),
    ]);
    let templates = Templates::load(dir.path()).unwrap();
    let error = templates
        .render("k", None, &json!({"name": "Ada"}))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "template \"k\" layouts/frame.hbs line 2: variable \"brand\" not found in the job data"
    );
}

#[test]
fn null_data_is_a_missing_variable_not_an_empty_email() {
    let error = shipped()
        .render("welcome", None, &serde_json::Value::Null)
        .unwrap_err();
    assert!(matches!(error, RenderError::Template { .. }), "{error}");
}

#[test]
fn unknown_kind_is_refused_by_name() {
    for kind in [
        "nope",
        "../welcome",
        "welcome/../welcome",
        "layouts",
        "partials/footer",
        "",
    ] {
        let error = shipped().render(kind, None, &json!({})).unwrap_err();
        assert!(
            matches!(&error, RenderError::UnknownKind { kind: k } if k == kind),
            "{error}"
        );
    }
    let error = shipped().render("nope", None, &json!({})).unwrap_err();
    assert_eq!(error.to_string(), "no template for kind \"nope\"");
}

#[test]
fn subject_with_crlf_is_refused_as_header_injection() {
    let data = sample_with("welcome", "/user/name", json!("Ada\r\nBcc: x@evil.example"));
    let error = shipped().render("welcome", None, &data).unwrap_err();

    assert!(matches!(&error, RenderError::HeaderInjection { kind, .. } if kind == "welcome"));
    let text = error.to_string();
    assert_eq!(
        text,
        "template \"welcome\" rendered a subject containing a carriage return (U+000D) at \
         character 27; refused, as it could inject mail headers"
    );
    assert!(!text.contains("evil"));
}

#[test]
fn subject_with_a_trailing_newline_from_data_is_refused_not_trimmed() {
    let data = sample_with("order_confirmation", "/order/id", json!("A-1\n"));
    let error = shipped()
        .render("order_confirmation", None, &data)
        .unwrap_err();
    assert!(
        matches!(error, RenderError::HeaderInjection { .. }),
        "{error}"
    );
}

#[test]
fn link_that_is_not_http_is_refused() {
    for link in [
        "javascript:alert(1)",
        " https://acme.example",
        "//evil.example",
        "data:text/html,x",
    ] {
        let data = sample_with("password_reset", "/reset_url", json!(link));
        let error = shipped().render("password_reset", None, &data).unwrap_err();
        assert_eq!(
            error.to_string(),
            "template \"password_reset\" html.hbs line 12: helper \"url\": variable \"reset_url\" \
             is not an http(s) link",
            "for {link:?}"
        );
    }
}

#[test]
fn link_of_the_wrong_type_is_refused() {
    let data = sample_with("password_reset", "/reset_url", json!(42));
    let error = shipped().render("password_reset", None, &data).unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("variable \"reset_url\" is not a string"),
        "{error}"
    );
}
