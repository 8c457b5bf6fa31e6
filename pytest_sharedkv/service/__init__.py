"""The service-regression tier: a fixed corpus through a replica pair, every answer
checked against a reference known by construction, every hit accounted for."""
