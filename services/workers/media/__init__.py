"""Media workers: image and video generation behind ``MediaService`` (protos/meshfront/worker/v1/media.proto)."""
