"""Swagger UI for /docs, from the swagger-ui-bundle PyPI package (no CDN: the edge works offline).

The page is ours (the package's index.html points at the Petstore demo); its scripts, style sheet
and icons are the package's files, served at /docs/assets/<name> from an allow-list, each with its
content type.
"""

from __future__ import annotations

import functools
import pathlib

from swagger_ui_bundle import swagger_ui_path

ASSET_PREFIX = "/docs/assets/"
# The bundle files the page uses -> their content types; nothing else is served.
ASSETS = {
    "swagger-ui-bundle.js": "application/javascript; charset=utf-8",
    "swagger-ui-standalone-preset.js": "application/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
    "favicon-16x16.png": "image/png",
}
PAGE_TYPE = "text/html; charset=utf-8"

PAGE = f"""<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Meshfront API</title>
  <link rel="stylesheet" type="text/css" href="{ASSET_PREFIX}swagger-ui.css">
  <link rel="icon" type="image/png" href="{ASSET_PREFIX}favicon-32x32.png" sizes="32x32">
  <link rel="icon" type="image/png" href="{ASSET_PREFIX}favicon-16x16.png" sizes="16x16">
  <style>body {{ margin: 0; }}</style>
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{ASSET_PREFIX}swagger-ui-bundle.js" charset="utf-8"></script>
  <script src="{ASSET_PREFIX}swagger-ui-standalone-preset.js" charset="utf-8"></script>
  <script>
    window.onload = function () {{
      window.ui = SwaggerUIBundle({{
        url: "/openapi.json",
        dom_id: "#swagger-ui",
        deepLinking: true,
        presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
        layout: "BaseLayout"
      }});
    }};
  </script>
</body>
</html>
""".encode()


def bundle_dir() -> pathlib.Path:
    return pathlib.Path(str(swagger_ui_path))


@functools.cache
def asset(name: str) -> tuple[str, bytes] | None:
    """(content type, bytes) of an allowed bundle file, or None (read once, then kept)."""
    content_type = ASSETS.get(name)
    if content_type is None:
        return None
    return content_type, (bundle_dir() / name).read_bytes()
