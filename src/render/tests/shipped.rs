//! The shipped templates: each renders its sample as snapshotted, escapes data in HTML only,
//! and picks locale variants with fallback.

use serde_json::json;

use super::{fixture_with, sample_with, shipped, show};
use crate::render::Templates;

#[test]
fn every_shipped_kind_renders_its_sample_as_snapshotted() {
    let templates = shipped();
    assert_eq!(
        templates.kinds(),
        ["order_confirmation", "password_reset", "welcome"]
    );
    for kind in templates.kinds() {
        let email = templates
            .render(&kind, None, templates.sample(&kind).unwrap())
            .unwrap();
        insta::assert_snapshot!(kind.clone(), show(&email));
    }
}

#[test]
fn french_welcome_renders_its_sample_as_snapshotted() {
    let templates = shipped();
    let email = templates
        .render("welcome", Some("fr"), templates.sample("welcome").unwrap())
        .unwrap();
    insta::assert_snapshot!("welcome_fr", show(&email));
}

#[test]
fn html_part_escapes_hostile_data_and_text_part_keeps_it_verbatim() {
    let data = sample_with(
        "welcome",
        "/user/name",
        json!("<script>alert(1)</script>\"onmouseover=alert(2)"),
    );
    let email = shipped().render("welcome", None, &data).unwrap();

    assert!(!email.html.contains("<script>"));
    assert!(!email.html.contains("\"onmouseover"));
    assert!(
        email
            .html
            .contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;onmouseover&#x3D;alert(2)")
    );
    let text = email.text.unwrap();
    assert!(text.contains("<script>alert(1)</script>\"onmouseover=alert(2)"));
    assert!(
        email
            .subject
            .contains("<script>alert(1)</script>\"onmouseover=")
    );
}

#[test]
fn ampersand_is_escaped_in_html_only() {
    let data = sample_with("welcome", "/product_name", json!("Smith & Sons"));
    let email = shipped().render("welcome", None, &data).unwrap();

    assert_eq!(email.subject, "Welcome to Smith & Sons, Ada!");
    assert!(email.text.unwrap().contains("signing up for Smith & Sons."));
    assert!(email.html.contains("signing up for Smith &amp; Sons."));
    assert!(!email.html.contains("Smith & Sons"));
}

#[test]
fn locale_falls_back_from_region_to_language_to_default() {
    let templates = shipped();
    let sample = templates.sample("welcome").unwrap();
    let subject = |locale| templates.render("welcome", locale, sample).unwrap().subject;

    assert_eq!(subject(None), "Welcome to Acme Cloud, Ada!");
    assert_eq!(subject(Some("fr")), "Bienvenue sur Acme Cloud, Ada !");
    assert_eq!(subject(Some("fr-CA")), "Bienvenue sur Acme Cloud, Ada !");
    assert_eq!(subject(Some("FR")), "Bienvenue sur Acme Cloud, Ada !");
    assert_eq!(subject(Some("de")), "Welcome to Acme Cloud, Ada!");
    assert_eq!(subject(Some("")), "Welcome to Acme Cloud, Ada!");

    let french = templates.render("welcome", Some("fr-CA"), sample).unwrap();
    assert!(french.html.contains("<html lang=\"fr\">"));
    assert!(french.text.unwrap().starts_with("Bienvenue, Ada !"));
}

#[test]
fn each_part_falls_back_to_its_default_on_its_own() {
    let dir = fixture_with(&[
        ("k/subject.pt.hbs", "Olá {{name}}"),
        ("k/text.pt-BR.hbs", "Oi {{name}}"),
    ]);
    let templates = Templates::load(dir.path()).unwrap();
    let data = json!({"name": "Ada"});
    let render = |locale| templates.render("k", Some(locale), &data).unwrap();

    let brazil = render("pt-BR");
    assert_eq!(brazil.subject, "Olá Ada");
    assert_eq!(brazil.html, "<p>Hello Ada</p>\n");
    assert_eq!(brazil.text.as_deref(), Some("Oi Ada"));

    let portugal = render("pt-PT");
    assert_eq!(portugal.subject, "Olá Ada");
    assert_eq!(portugal.text, None);
}

#[test]
fn set_answers_kinds_samples_and_revision() {
    let templates = shipped();
    assert!(templates.contains("password_reset"));
    assert!(!templates.contains("layouts"));
    assert!(!templates.contains("../welcome"));
    assert_eq!(
        templates.sample("password_reset").unwrap()["expires_in_minutes"],
        json!(30)
    );
    assert_eq!(templates.sample("nope"), None);

    let revision = templates.revision();
    assert_eq!(revision.len(), 16);
    assert!(revision.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[test]
fn revision_is_stable_and_follows_content() {
    let dir = fixture_with(&[]);
    let first = Templates::load(dir.path()).unwrap().revision().to_owned();
    let again = Templates::load(dir.path()).unwrap().revision().to_owned();
    assert_eq!(first, again);

    std::fs::write(dir.path().join("k/html.hbs"), "<p>Hi {{name}}</p>").unwrap();
    let edited = Templates::load(dir.path()).unwrap().revision().to_owned();
    assert_ne!(first, edited);
}
