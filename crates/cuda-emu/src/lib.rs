//! placeholder (the emulator is being written)
