//! `data:` URLs.

use lmi_media::{ImageLimits, MediaError, parse_data_url};

fn limits() -> ImageLimits {
    ImageLimits::default()
}

#[test]
fn base64_with_and_without_padding_and_white_space() {
    let (mime, bytes) = parse_data_url("data:image/png;base64,aGVsbG8=", &limits()).unwrap();
    assert_eq!(
        (mime.as_str(), bytes.as_slice()),
        ("image/png", &b"hello"[..])
    );
    let (_, bytes) = parse_data_url("data:image/png;base64,aGVsbG8", &limits()).unwrap();
    assert_eq!(bytes, b"hello");
    let (_, bytes) = parse_data_url("data:image/png;base64,aGVs\r\nbG8=", &limits()).unwrap();
    assert_eq!(bytes, b"hello");
    let (mime, _) =
        parse_data_url("DATA:Image/JPEG;name=x.jpg;BASE64,aGVsbG8=", &limits()).unwrap();
    assert_eq!(mime, "image/jpeg");
}

#[test]
fn percent_encoded_text_and_the_default_type() {
    let (mime, bytes) = parse_data_url("data:,a%20b%2Cc", &limits()).unwrap();
    assert_eq!(
        (mime.as_str(), bytes.as_slice()),
        ("text/plain", &b"a b,c"[..])
    );
    let (mime, bytes) = parse_data_url("data:image/svg+xml,<svg/>", &limits()).unwrap();
    assert_eq!(
        (mime.as_str(), bytes.as_slice()),
        ("image/svg+xml", &b"<svg/>"[..])
    );
}

#[test]
fn malformed_urls_say_what_is_wrong() {
    for (url, says) in [
        ("http://example.com/a.png", "does not start with 'data:'"),
        ("data:image/png;base64", "no ','"),
        ("data:image/png;base64,!!!!", "not valid base64"),
        ("data:image/png;base64,aGVsbG8=x", "not valid base64"),
        ("data:png;base64,aGVsbG8=", "not a media type"),
        ("data:text/plain,100%", "two hex digits"),
        ("dat", "does not start with 'data:'"),
    ] {
        match parse_data_url(url, &limits()) {
            Err(e @ MediaError::DataUrl(_)) => assert!(e.to_string().contains(says), "{url}: {e}"),
            other => panic!("{url}: expected a DataUrl error, got {other:?}"),
        }
    }
}

#[test]
fn oversize_content_is_refused() {
    let small = ImageLimits {
        max_bytes: 4,
        ..ImageLimits::default()
    };
    assert!(matches!(
        parse_data_url("data:image/png;base64,aGVsbG8=", &small),
        Err(MediaError::TooManyBytes {
            size: 5,
            limit: 4,
            ..
        })
    ));
    // Far over: refused from the length of the text, before decoding.
    let long = format!("data:image/png;base64,{}", "A".repeat(4000));
    assert!(matches!(
        parse_data_url(&long, &small),
        Err(MediaError::TooManyBytes { .. })
    ));
    assert!(matches!(
        parse_data_url("data:,hello", &small),
        Err(MediaError::TooManyBytes { .. })
    ));
}
