"""Reports people read: terminal table, markdown, HTML and SVG, videos and traces of episodes."""
