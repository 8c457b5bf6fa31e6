"""What a run sends: cases with payloads and known answers, the seeded copy corpus, the
planted-codeword text corpus for a user's model, and which corpus a run uses."""
