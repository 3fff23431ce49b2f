//! Wire types for the LMI, TGI and OpenAI schemas (being written).
