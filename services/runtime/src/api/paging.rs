//! Page size and page token of the List calls, read the same way everywhere.

use mentis_core::Error;

const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// `page_size` of a List request: 0 = 100, capped at 1000, negative is InvalidArgument.
pub fn page_size(requested: i32) -> Result<usize, Error> {
    match requested {
        0 => Ok(DEFAULT_PAGE),
        n if n < 0 => Err(Error::invalid("page_size may not be negative").at("page_size")),
        n => Ok(usize::try_from(n).unwrap_or(MAX_PAGE).min(MAX_PAGE)),
    }
}

/// `page_token` of a List request: empty = first page, otherwise what `parse` makes of it (a token this
/// service gave out); anything else is InvalidArgument.
pub fn page_token<T, E>(
    token: &str,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<Option<T>, Error> {
    if token.is_empty() {
        return Ok(None);
    }
    parse(token)
        .map(Some)
        .map_err(|_| Error::invalid("page_token is not one this service gave out").at("page_token"))
}
