"""horizon.studies: study code above the RL runtime (the self-summarization study: `selfsum`,
`selfsum_metrics`); experiments/ drivers call it."""
