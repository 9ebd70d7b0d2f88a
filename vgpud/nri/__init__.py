"""NRI plugin: sans-IO ttrpc and mux codecs, the Trio session on top, and the hooks it serves."""
