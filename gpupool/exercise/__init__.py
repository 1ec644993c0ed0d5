"""What runs on the lab to prove the pool: failure drills, policy replays and the
checkpoint archive, with the context they share."""
