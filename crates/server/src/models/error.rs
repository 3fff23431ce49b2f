//! Why a model could not be made ready.

/// Why a model could not be loaded or registered, with the HTTP code DJL and SageMaker give.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadError {
    /// 404: no such model.
    NotFound(String),
    /// 409: the name is taken.
    Conflict(String),
    /// 507: it does not fit in the memory (or model count) left.
    NoRoom(String),
    /// 400: its files are missing or not a model.
    BadModel(String),
    /// 503: too many requests waiting, or it did not load in time.
    Busy(String),
    /// 500: a request's model failed to load (its files are broken).
    Broken(String),
}

impl LoadError {
    pub fn code(&self) -> u16 {
        match self {
            LoadError::NotFound(_) => 404,
            LoadError::Conflict(_) => 409,
            LoadError::NoRoom(_) => 507,
            LoadError::BadModel(_) => 400,
            LoadError::Busy(_) => 503,
            LoadError::Broken(_) => 500,
        }
    }
    pub fn message(&self) -> &str {
        match self {
            LoadError::NotFound(m)
            | LoadError::Conflict(m)
            | LoadError::NoRoom(m)
            | LoadError::BadModel(m)
            | LoadError::Busy(m)
            | LoadError::Broken(m) => m,
        }
    }
    /// DJL's exception type names.
    pub fn kind(&self) -> &'static str {
        match self {
            LoadError::NotFound(_) => "ModelNotFoundException",
            LoadError::Conflict(_) => "ConflictException",
            LoadError::NoRoom(_) => "InsufficientMemoryException",
            LoadError::BadModel(_) => "BadRequestException",
            LoadError::Busy(_) => "ServiceUnavailableException",
            LoadError::Broken(_) => "ModelLoadException",
        }
    }
}

impl LoadError {
    /// The error a request for the model gets: a model that cannot be loaded is the server's
    /// failure (500) there, not the request's (the 400 its registration gets).
    pub fn for_request(self) -> LoadError {
        match self {
            LoadError::BadModel(m) => LoadError::Broken(m),
            e => e,
        }
    }
}
