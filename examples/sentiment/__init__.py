"""The demo release: Rotten Tomatoes sentiment, MiniLM center, small INT8 edge student."""
