// CUBIN parsing for the fake driver (see cubin.h).
//
// The .nv.info sections hold attribute records: {u8 format, u8 attribute, u16 size-or-value}
// followed, for format 4 (EIFMT_SVAL), by `size` bytes. Per kernel (.nv.info.<name>):
// EIATTR_KPARAM_INFO (0x17, one per parameter: u32 index, u16 ordinal, u16 offset, u32 whose
// bits 18..31 are the size), EIATTR_CBANK_PARAM_SIZE (0x19, the buffer's size in the record's
// value field), EIATTR_MAX_THREADS (0x05, u32 x, y, z of __launch_bounds__). In the module's
// .nv.info: EIATTR_REGCOUNT (0x2f) and EIATTR_FRAME_SIZE (0x11), each {u32 symbol, u32 value}.
#include "cubin.h"

#include <cstring>
#include <map>

namespace fake {

namespace {

constexpr uint16_t kEmCuda = 190;
constexpr uint8_t kEifmtSval = 4;
constexpr uint8_t kAttrMaxThreads = 0x05;
constexpr uint8_t kAttrFrameSize = 0x11;
constexpr uint8_t kAttrKparamInfo = 0x17;
constexpr uint8_t kAttrCbankParamSize = 0x19;
constexpr uint8_t kAttrRegcount = 0x2f;
// Every block's shared memory starts with 1 KiB the system reserves (sm_80 and later); the
// .nv.shared.<kernel> section counts it.
constexpr uint32_t kReservedShared = 1024;

struct Shdr {
    uint32_t name, type;
    uint64_t flags, addr, offset, size;
    uint32_t link, info;
    uint64_t align, entsize;
};
struct Sym {
    uint32_t name;
    uint8_t info, other;
    uint16_t shndx;
    uint64_t value, size;
};

template <typename T>
T read(const uint8_t* p) {
    T v;
    memcpy(&v, p, sizeof v);
    return v;
}

// Calls f(attribute, value_bytes, value_len, inline_value) for each record of a .nv.info
// section; false if the records run past the section.
template <typename F>
bool for_each_attr(const uint8_t* p, size_t len, F f) {
    size_t o = 0;
    while (o + 4 <= len) {
        const uint8_t fmt = p[o], attr = p[o + 1];
        const uint16_t v = read<uint16_t>(p + o + 2);
        if (fmt == kEifmtSval) {
            if (o + 4 + v > len) return false;
            f(attr, p + o + 4, (size_t)v, 0u);
            o += 4 + (size_t)v;
        } else {
            f(attr, nullptr, 0, (unsigned)v);
            o += 4;
        }
    }
    return o == len;
}

}  // namespace

bool parse_cubin(const void* image, Cubin* out, std::string* error) {
    const uint8_t* d = static_cast<const uint8_t*>(image);
    if (!d || memcmp(d, "\x7f" "ELF", 4) != 0 || d[4] != 2 /* ELFCLASS64 */) {
        *error = "not a 64-bit ELF image (a CUBIN was expected)";
        return false;
    }
    if (read<uint16_t>(d + 0x12) != kEmCuda) {
        *error = "an ELF image for another machine than CUDA (e_machine is not EM_CUDA)";
        return false;
    }
    const uint32_t flags = read<uint32_t>(d + 0x30);
    // ABI version 8 (CUDA 12.8 and later) keeps the SM number in bits 8..15, older in 0..7.
    out->sm = d[8] >= 8 ? (flags >> 8) & 0xff : flags & 0xff;
    const uint64_t shoff = read<uint64_t>(d + 0x28);
    const uint16_t shentsize = read<uint16_t>(d + 0x3a), shnum = read<uint16_t>(d + 0x3c),
                   shstrndx = read<uint16_t>(d + 0x3e);
    if (shentsize != sizeof(Shdr) || shstrndx >= shnum) {
        *error = "malformed ELF section headers";
        return false;
    }
    std::vector<Shdr> sh(shnum);
    size_t end = shoff + (size_t)shnum * shentsize;
    for (uint16_t i = 0; i < shnum; ++i) {
        memcpy(&sh[i], d + shoff + (size_t)i * shentsize, sizeof(Shdr));
        if (sh[i].type != 8 /* SHT_NOBITS */ && sh[i].offset + sh[i].size > end)
            end = sh[i].offset + sh[i].size;
    }
    out->image_bytes = end;
    auto name_of = [&](uint32_t off) {
        return reinterpret_cast<const char*>(d + sh[shstrndx].offset + off);
    };

    const Shdr* symtab = nullptr;
    for (const Shdr& s : sh)
        if (s.type == 2 /* SHT_SYMTAB */) symtab = &s;
    if (!symtab) {
        *error = "no symbol table";
        return false;
    }
    const char* strtab = reinterpret_cast<const char*>(d + sh[symtab->link].offset);
    const size_t nsyms = symtab->size / sizeof(Sym);
    std::map<uint32_t, size_t> kernel_of_sym;  // symbol index -> kernel
    for (size_t i = 0; i < nsyms; ++i) {
        Sym s;
        memcpy(&s, d + symtab->offset + i * sizeof(Sym), sizeof s);
        // Global functions marked as entries (STO_CUDA_ENTRY, 0x10 in st_other) are kernels.
        if ((s.info & 0xf) == 2 /* STT_FUNC */ && (s.info >> 4) == 1 /* STB_GLOBAL */ &&
            (s.other & 0x10)) {
            kernel_of_sym[(uint32_t)i] = out->kernels.size();
            CubinKernel k;
            k.name = strtab + s.name;
            out->kernels.push_back(k);
        }
    }

    std::map<std::string, size_t> by_name;
    for (size_t i = 0; i < out->kernels.size(); ++i) by_name[out->kernels[i].name] = i;
    for (const Shdr& s : sh) {
        const std::string name = name_of(s.name);
        const uint8_t* p = d + s.offset;
        if (name == ".nv.info") {
            const bool ok = for_each_attr(p, s.size, [&](uint8_t a, const uint8_t* v, size_t n,
                                                         unsigned) {
                if ((a != kAttrRegcount && a != kAttrFrameSize) || n != 8) return;
                auto it = kernel_of_sym.find(read<uint32_t>(v));
                if (it == kernel_of_sym.end()) return;
                CubinKernel& k = out->kernels[it->second];
                (a == kAttrRegcount ? k.registers : k.frame_bytes) = read<uint32_t>(v + 4);
            });
            if (!ok) {
                *error = "malformed .nv.info";
                return false;
            }
        } else if (name.rfind(".nv.info.", 0) == 0) {
            auto it = by_name.find(name.substr(9));
            if (it == by_name.end()) continue;
            CubinKernel& k = out->kernels[it->second];
            const bool ok = for_each_attr(p, s.size, [&](uint8_t a, const uint8_t* v, size_t n,
                                                         unsigned inline_value) {
                if (a == kAttrKparamInfo && n == 12) {
                    const uint16_t ordinal = read<uint16_t>(v + 4);
                    const uint16_t offset = read<uint16_t>(v + 6);
                    const uint32_t size = (read<uint32_t>(v + 8) >> 18) & 0x3fff;
                    if (k.params.size() <= ordinal) k.params.resize(ordinal + 1u);
                    k.params[ordinal] = CubinParam{offset, size};
                } else if (a == kAttrCbankParamSize) {
                    k.param_bytes = inline_value;
                } else if (a == kAttrMaxThreads && n == 12) {
                    k.max_threads =
                        read<uint32_t>(v) * read<uint32_t>(v + 4) * read<uint32_t>(v + 8);
                }
            });
            if (!ok) {
                *error = "malformed " + name;
                return false;
            }
        } else if (name.rfind(".nv.shared.", 0) == 0) {
            auto it = by_name.find(name.substr(11));
            if (it == by_name.end()) continue;
            out->kernels[it->second].static_shared =
                s.size > kReservedShared ? (uint32_t)s.size - kReservedShared : 0;
        }
    }
    return true;
}

}  // namespace fake
