#pragma once
// The kernel templates compiled into the library. The table is generated at build time by
// cmake/embed_templates.cmake (build/generated/embedded_templates.cpp), sorted by path; each
// `data` is `size` bytes followed by a NUL.
namespace mlajit::detail {

struct EmbeddedTemplate {
  const char* path;  // relative to templates/, '/'-separated, e.g. "common/convert.cuh"
  const char* data;
  unsigned size;
};

extern const EmbeddedTemplate kEmbeddedTemplates[];
extern const unsigned kNumEmbeddedTemplates;

}  // namespace mlajit::detail
