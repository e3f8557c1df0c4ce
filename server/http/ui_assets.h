/* The operator console's files, compiled in: the table tools/ui-embed.sh generates from ui/. */
#ifndef BLOBREF_UI_ASSETS_H
#define BLOBREF_UI_ASSETS_H

#include <stddef.h>

struct ui_asset {
  const char *name;          /* under /ui/: "" is index.html; hashed ones "app.1a2b3c4d.js" */
  const char *content_type;  /* with charset for text */
  const unsigned char *data; /* static, never freed */
  size_t len;
  const char *etag; /* "\"<16 hex of the content's SHA-256>\"" */
  int immutable;    /* a content hash is in the name: cached for a year */
};

/* Generated ($(BUILD_ROOT)/gen/ui_assets.c): every asset, index.html first. */
extern const struct ui_asset ui_assets[];
extern const size_t ui_nassets;

#endif
